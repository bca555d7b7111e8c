"""Kineto decoding: the per-phase fast path and the plain fallback give the same rows."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from parsers import kineto
from parsers.base import ParsedRank, RankFiles

GLOO_RANK0 = "kineto/gloo_pp2_dp2/rank0.json"


def _parse(data: bytes) -> ParsedRank:
    files = RankFiles("kineto", "rank0.json", {"trace": "rank0.json"}, 0)
    return kineto.parse(files, lambda member: data)


def test_flow_events_decode_without_fields(real: Path) -> None:
    """Flows and other unused phases decode to empty structs; instants (the `[memory]` events
    among them) keep their fields."""
    trace = kineto._decode_doc((real / GLOO_RANK0).read_bytes())
    assert isinstance(trace, kineto._TaggedTrace)
    phases = {e.ph for e in trace.traceEvents}
    assert {"X", "M", "i", "s", "f"} <= phases
    skipped = [e for e in trace.traceEvents if e.ph not in ("X", "M", "i")]
    assert all(not msgspec.structs.fields(e) for e in skipped)
    instants = [e for e in trace.traceEvents if e.ph == "i"]
    assert [e.name for e in instants] == ["Iteration Start: PyTorch Profiler",
                                          "Record Window End"]


def test_unknown_phase_falls_back_to_the_plain_decoding(real: Path) -> None:
    doc = json.loads((real / GLOO_RANK0).read_bytes())
    plain = _parse(json.dumps(doc).encode())
    # "Z" is no Chrome trace phase: the tagged decoder refuses it, the plain one keeps going
    doc["traceEvents"].append({"ph": "Z", "name": "odd", "pid": 1, "tid": 1, "ts": 1.0})
    trace = kineto._decode_doc(json.dumps(doc).encode())
    assert not isinstance(trace, kineto._TaggedTrace)
    assert trace.traceEvents[-1].ph == "Z"
    assert _parse(json.dumps(doc).encode()).events.equals(plain.events)
