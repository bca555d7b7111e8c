"""Kineto decoding: the per-phase fast path and the plain fallback, and events decoded in
batches, give the same rows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest

from parsers import kineto
from parsers.base import ParsedRank, RankFiles, TraceError

GLOO_RANK0 = "kineto/gloo_pp2_dp2/rank0.json"
NCCL_RANK0 = "kineto/hta/nccl_parser_config/nccl_data.json.gz"  # NCCL kernels with comm args
HTA_RANK0 = "kineto/hta/negative_queue_length_values_check/rank0.json.gz"  # syncs, copies


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


def _parse_file(path: Path) -> ParsedRank:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return _parse(data)


@pytest.mark.parametrize("trace", [GLOO_RANK0, NCCL_RANK0, HTA_RANK0])
def test_batches_give_the_rows_of_one_decoding(real: Path, trace: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Events decoded a few at a time (comm ops, gloo annotations, NCCL kernels with their
    args, syncs and copies whose args are read later, kept across batches) make the same
    table, groups and meta as one batch of all."""
    whole = _parse_file(real / trace)
    decoded: list[int] = []
    per_phase = kineto._per_phase

    def counted(data: bytes, tagged: object, plain: object) -> object:
        out = per_phase(data, tagged, plain)
        decoded.append(len(out) if isinstance(out, list) else -1)
        return out

    monkeypatch.setattr(kineto, "BATCH_EVENTS", 97)
    monkeypatch.setattr(kineto, "_per_phase", counted)
    batched = _parse_file(real / trace)
    assert len(decoded) > 3 and max(decoded) <= 97  # never more events decoded at once
    assert batched.events.equals(whole.events)
    assert (batched.groups, batched.meta, batched.warnings, batched.damaged) == (
        whole.groups, whole.meta, whole.warnings, whole.damaged)
    assert whole.events.num_rows > 700  # many batches


def test_a_bad_event_in_a_batch_is_named_as_in_the_whole_file(
        real: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes that are no UTF-8 inside one event (the batches split the array unchecked) get
    the one-line error naming the file, not a decoder's traceback."""
    data = (real / GLOO_RANK0).read_bytes()
    at = data.index(b'"name": "', len(data) // 2) + len(b'"name": "')
    monkeypatch.setattr(kineto, "BATCH_EVENTS", 97)
    with pytest.raises(TraceError, match=r"rank0.json: invalid JSON \(Invalid UTF-8"):
        _parse(data[:at] + b"\xff\xfe" + data[at:])
