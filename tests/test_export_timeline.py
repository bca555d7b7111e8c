"""`tracegraph export --perfetto / --chrome` as a user runs it, read back as Perfetto reads it.

The protobuf is decoded with the `perfetto` package's own classes (tests/perfetto_decode.py);
every expectation comes from `analyze --json` of the same bundle or from the bundle's events,
never from the writer itself.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

import tracegraph
from reports.tracks import BUBBLES, CHAINS, PATH, PID_BASE
from tests.conftest import SAMPLES
from tests.perfetto_decode import Decoded, decode
from tests.test_cli import tracegraph as run_cli

SEED = SAMPLES / "simulated" / "hsdp-straggler-sync-ascend.tar.gz"
US = 1_000  # ns


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Decoded, dict, str]:
    """The seed case: `analyze --json` (every bubble), the decoded .pftrace, the Chrome JSON
    and its text."""
    folder = tmp_path_factory.mktemp("seed")
    cache = folder / "cache"
    run = run_cli("analyze", str(SEED), "--json", "--top", "0", cache=cache)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    run = run_cli("export", str(SEED), "--perfetto", str(folder / "seed.pftrace"), "--chrome",
                  str(folder / "seed.json"), cache=cache)
    assert run.returncode == 0, run.stderr
    assert "wrote" in run.stdout
    text = (folder / "seed.json").read_text()
    return summary, decode(folder / "seed.pftrace"), json.loads(text), text


def _at(summary: dict, ms: float) -> int:
    """An `analyze --json` time (ms from the origin) as aligned ns."""
    return summary["origin_ns"] + round(ms * 1e6)


def test_one_process_per_rank_with_its_lanes_and_the_verdict_tracks(seed) -> None:
    summary, trace, _, _ = seed
    events = tracegraph.load(SEED, use_cache=False).events
    assert sorted(pid for pid, _, _ in trace.processes.values()) == [
        PID_BASE + r["rank"] for r in summary["ranks"]]
    for uuid, (pid, name, labels) in trace.processes.items():
        rank = pid - PID_BASE
        assert name == f"rank {rank}"
        assert any(label.startswith("clock offset") for label in labels)
        tracks = trace.track_names(uuid)
        lanes = set(events.loc[events["rank"] == rank, "lane"])
        # the main compute lane (stream 47 on every rank of the seed), then the verdict
        verdict = list(dict.fromkeys(t for t in tracks if t in (BUBBLES, PATH, CHAINS)))
        assert BUBBLES in verdict
        assert tracks[:1 + len(verdict)] == ["stream 47", *verdict]
        assert set(tracks) - {BUBBLES, PATH, CHAINS} == lanes
    assert trace.unmatched_ends == 0 and all(s.end >= s.start for s in trace.slices)


def test_every_profile_event_is_a_slice_with_its_name_time_and_fields(seed) -> None:
    summary, trace, _, _ = seed
    loaded = tracegraph.load(SEED, use_cache=False)
    events = loaded.events
    offsets = {int(r): int(ns) for r, ns in summary["clock_offsets_ns"].items()}
    expected = Counter(
        (f"rank {r}", lane, name, start - offsets[r], start - offsets[r] + dur)
        for r, lane, name, start, dur in zip(events["rank"], events["lane"], events["name"],
                                             events["start_ns"], events["dur_ns"], strict=True))
    process = {uuid: name for uuid, (_, name, _) in trace.processes.items()}
    got = Counter((process[trace.tracks[s.track][1]], trace.tracks[s.track][0], s.name,
                   s.start, s.end) for s in trace.slices if s.category != "tracegraph")
    assert got == expected
    # fields kept as args, the profile's category beside tracegraph's kind
    wait = next(s for s in trace.slices if s.name == "EVENT_WAIT")
    assert wait.category == "EVENT_WAIT_SQE,wait" and wait.args["correlation"] > 0


def test_every_bubble_is_on_its_rank_named_by_its_cause(seed) -> None:
    summary, trace, _, _ = seed
    assert len(summary["bubbles"]) == summary["bubble_count"] > 50
    shown = Counter()
    for rank in {b["rank"] for b in summary["bubbles"]}:
        for piece in trace.on(f"rank {rank}", BUBBLES):
            if piece.depth == 0:
                shown[rank, piece.start, piece.end, piece.name] += 1
    for bubble in summary["bubbles"]:
        start = _at(summary, bubble["start_ms"])
        end = start + round(bubble["dur_ms"] * 1e6)
        match = [k for k in shown if k[0] == bubble["rank"] and abs(k[1] - start) <= US
                 and abs(k[2] - end) <= 2 * US and k[3] == bubble["category"]]
        assert match, bubble
    assert sum(shown.values()) == len(summary["bubbles"])
    top = max((s for s in trace.slices if s.depth == 0 and "top" in s.args),
              key=lambda s: s.end - s.start)
    first = summary["bubbles"][0]
    assert top.args["top"] == "#1" and top.args["root.rank"] == first["root"]["rank"]
    assert top.args["root.op"] == first["root"]["name"]
    assert top.args["chain"] == " ← ".join(f"rank {r}" for r in first["chain"])
    assert top.args["confidence"] == first["confidence"]["level"]


def test_the_rank_4096_wait_is_on_the_aligned_clock(seed) -> None:
    """README: rank 4096's 473 ms EVENT_WAIT on stream 47; its clock is offset by 1.7 ms, so
    an unaligned export would miss by far more than 1 µs."""
    summary, trace, chrome, text = seed
    wait = max((b for b in summary["bubbles"] if b["rank"] == 4096
                and b["name"] == "EVENT_WAIT"), key=lambda b: b["dur_ms"])
    assert 470 < wait["dur_ms"] < 476
    assert abs(summary["clock_offsets_ns"]["4096"]) > 1_000 * US
    start = _at(summary, wait["start_ms"])
    ops = [s for s in trace.on("rank 4096", "stream 47") if s.name == "EVENT_WAIT"]
    assert min(abs(s.start - start) for s in ops) <= US
    # the Chrome variant: the same instant, written as exact µs
    pid = PID_BASE + 4096
    stamps = [int(m[1]) * 1000 + int(m[2]) for m in re.finditer(
        r'\{"ph":"X","ts":(\d+)\.(\d{3}),"dur":[\d.]+,"pid":' + str(pid)
        + r',"tid":\d+,"name":"EVENT_WAIT"', text)]
    assert min(abs(ts - start) for ts in stamps) <= US


def test_the_critical_path_in_order_with_flows_across_ranks(seed) -> None:
    summary, trace, _, _ = seed
    segments = summary["critical_path"]["1"]["segments"]
    top = sorted((s for s in trace.slices if trace.tracks[s.track][:2] == (PATH, 0)),
                 key=lambda s: s.start)
    assert [(s.name, s.args["rank"], s.args["lane"], s.args["op"]) for s in top] == [
        (f"{g['kind']}: {g['category']}", g["rank"], g["lane"], g["name"]) for g in segments]
    assert all(abs(s.start - _at(summary, g["start_ms"])) <= US
               for s, g in zip(top, segments, strict=True))
    rank_of = {uuid: pid - PID_BASE for uuid, (pid, _, _) in trace.processes.items()}
    path_flows = [(a, b) for a, b in trace.flows() if a.name.split(": ")[0] in
                  ("compute", "transfer", "wait")]
    hops = [(a["rank"], b["rank"]) for a, b in zip(segments, segments[1:], strict=False)
            if a["rank"] != b["rank"]]
    assert len(hops) > 20 and len(path_flows) == len(hops)
    crossed = sorted(path_flows, key=lambda ab: ab[0].start)
    assert [(rank_of[trace.tracks[a.track][1]], rank_of[trace.tracks[b.track][1]])
            for a, b in crossed] == hops
    assert all(a.start <= b.start and a.end <= b.start + US for a, b in crossed)


def test_each_top_chain_flows_from_its_root_to_where_the_bubble_ended(seed) -> None:
    summary, trace, _, _ = seed
    flows = trace.flows()
    ids = [f for s in trace.slices for f in s.flow_out]
    assert len(ids) == len(set(ids)) == len(flows)  # one flow id per edge
    rank_of = {uuid: pid - PID_BASE for uuid, (pid, _, _) in trace.processes.items()}
    for number, bubble in enumerate(summary["bubbles"][:10], start=1):
        links = sorted(((a, b) for a, b in flows if a.name.startswith(f"#{number} ")),
                       key=lambda ab: ab[0].start)
        assert links, number
        last = links[-1][1]
        assert last.name == f"#{number} released"
        assert rank_of[trace.tracks[last.track][1]] == bubble["rank"]
        end = _at(summary, bubble["start_ms"] + bubble["dur_ms"])
        assert abs(last.start - end) <= 2 * US
        visited = {rank_of[trace.tracks[a.track][1]] for a, _ in links}
        assert bubble["root"]["rank"] in visited
        assert all(a.start <= b.start for a, b in links)
        if set(bubble["chain"]) != {bubble["rank"]}:
            assert any(rank_of[trace.tracks[a.track][1]] != rank_of[trace.tracks[b.track][1]]
                       for a, b in links)


def test_chrome_json_is_the_same_timeline_with_matching_v2_flows(seed) -> None:
    _, trace, chrome, _ = seed
    events = chrome["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["ph"] for e in events} == {"X", "M"}
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 and isinstance(e["pid"], int)
               and isinstance(e["tid"], int) and isinstance(e["args"], dict) for e in slices)
    assert Counter(e["name"] for e in slices) == Counter(s.name for s in trace.slices)
    named = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in slices} <= named
    flows: dict[int, list[dict]] = {}
    for e in slices:
        if "bind_id" in e:
            flows.setdefault(e["bind_id"], []).append(e)
    edges = 0
    for chain in flows.values():
        chain.sort(key=lambda e: e["ts"])
        assert chain[0]["flow_out"] and not chain[0]["flow_in"]
        assert chain[-1]["flow_in"] and not chain[-1]["flow_out"]
        assert all(e["flow_in"] and e["flow_out"] for e in chain[1:-1])
        edges += len(chain) - 1
    assert edges == len(trace.flows())


def test_kineto_host_threads_nest_and_overlaps_get_their_own_row(tmp_path: Path,
                                                                 real: Path) -> None:
    """A real Kineto trace (TraceLens' sample): host threads nest Python and runtime events,
    and some events overlap without nesting; every event must come back with its exact span,
    on its lane or on an overflow row of the same name."""
    bundle = real / "kineto" / "tracelens"
    run = run_cli("export", str(bundle), "--perfetto", str(tmp_path / "k.pftrace"),
                  cache=tmp_path / "cache")
    assert run.returncode == 0, run.stderr
    trace = decode(tmp_path / "k.pftrace")
    assert trace.unmatched_ends == 0
    assert max(s.depth for s in trace.slices) >= 2  # nested host events
    rows = Counter((name, parent) for name, parent, _ in trace.tracks.values())
    assert any(n > 1 for (name, _), n in rows.items() if name not in (BUBBLES, PATH, CHAINS))
    profile = [s for s in trace.slices if s.category != "tracegraph"]
    assert len(profile) == len(tracegraph.load(bundle, use_cache=False).events)
    by_row: dict[int, list] = {}
    for s in profile:
        by_row.setdefault(s.track, []).append(s)
    for row in by_row.values():  # on a row, slices nest or follow: none overlaps another
        ends: list[int] = []
        for s in sorted(row, key=lambda s: (s.start, -s.end)):
            while ends and ends[-1] <= s.start:
                ends.pop()
            assert not ends or s.end <= ends[-1]
            ends.append(s.end)


def test_export_without_an_output_is_one_line_exit_2(tmp_path: Path) -> None:
    run = run_cli("export", str(SEED), cache=tmp_path / "cache")
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "--perfetto" in run.stderr


def test_analyze_prints_each_steps_critical_path(tmp_path: Path) -> None:
    """The gloo sample: rank 1 sleeps 200 ms before its DP all-reduce; the path of the step
    runs through that sleep, and the printed length and composition are the JSON's."""
    bundle = SAMPLES / "gloo_pp2_dp2"
    run = run_cli("analyze", str(bundle), "--json", cache=tmp_path / "cache")
    summary = json.loads(run.stdout)
    run = run_cli("analyze", str(bundle), "--detail", cache=tmp_path / "cache")
    assert run.returncode == 0, run.stderr
    printed = run.stdout.replace("\n", " ")
    for step, path in summary["critical_path"].items():
        kind, ms = next(iter(path["by_kind"].items()))
        assert f"critical path {path['length_ms']:.3f} ms" in printed, step
        assert f"{kind} {ms:.3f} ms" in printed
    assert re.search(r"compute\s+rank 1 thread \d+ python\s+straggler_sleep.*compute_straggler",
                     run.stdout)


def test_parts_written_in_parallel_read_back_as_one_trace(tmp_path: Path, monkeypatch) -> None:
    """Large exports encode the events in forked processes, a packet sequence (or a run of
    JSON events) per part: read back, the trace is the one written in a single process."""
    from reports import parallel_write
    from reports.chrome_trace import write_chrome
    from reports.perfetto_trace import write_perfetto
    from reports.tracks import build_timeline
    from tracegraph.analysis.analyze import analyze

    timeline = build_timeline(analyze(tracegraph.load(SEED, use_cache=False)))
    write_perfetto(timeline, tmp_path / "one.pftrace", jobs=1)
    write_chrome(timeline, tmp_path / "one.json", jobs=1)
    monkeypatch.setattr(parallel_write, "PARALLEL_EVENTS", 0)
    assert len(timeline.parts(2 * parallel_write.PARTS_PER_JOB)) >= 4  # cut between tracks
    write_perfetto(timeline, tmp_path / "two.pftrace", jobs=2)
    write_chrome(timeline, tmp_path / "two.json", jobs=2)

    def slices(trace: Decoded) -> Counter:
        process = {uuid: name for uuid, (_, name, _) in trace.processes.items()}
        return Counter((process.get(trace.tracks[s.track][1]), trace.tracks[s.track][0],
                        s.name, s.category, s.start, s.end, tuple(sorted(s.args.items())))
                       for s in trace.slices)

    one, two = decode(tmp_path / "one.pftrace"), decode(tmp_path / "two.pftrace")
    assert two.unmatched_ends == 0 and slices(two) == slices(one)
    assert len(two.flows()) == len(one.flows())
    one_json, two_json = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert one_json.keys() == two_json.keys()
    assert Counter(json.dumps(e, sort_keys=True) for e in two_json["traceEvents"]) == Counter(
        json.dumps(e, sort_keys=True) for e in one_json["traceEvents"])
