"""Structural checks of the recorded corpus (tests/data/corpus, bench/record_corpus.py): each
folder holds the ranks its ground truth lists, tracegraph's loader reads them with the profiled
steps the truth names, and every injected delay lies where the truth says, on that rank only.

These test the recordings and their truth, not tracegraph's verdicts on them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import tracegraph
from tests.corpus import CASES, folder, raw, truth

EXPECTED = {
    "pp4_1f1b_healthy", "pp4_1f1b_bwd_straggler", "pp2dp2_wait_before_send",
    "pp2dp2_wait_after_send", "pp2dp2_one_replica", "hsdp_tail_wait_before_send",
    "hsdp_tail_wait_after_send", "ep4_a2a_layers", "dp4_fwd_straggler", "dp4_opt_straggler",
    "dp4_before_allreduce", "dp4_host_stall", "dp4_healthy", "world_metrics_allreduce",
    "pp4dp2_vpp_async_reduce", "pp4dp2_vpp_async_reduce_one_replica",
    "pp4dp2_vpp_wait_before_send", "pp2dp2_embedding_groups", "cp4_ring",
    "tp2pp2dp2_tp_straggler", "dp4_rotating_straggler",
}
COPIES = [c for c in CASES if truth(c)["copied_from"]]
SLEEP_NAMES = {"straggler_sleep", "expert_imbalance"}


def _spans(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def _named(spans: list[dict], name: str) -> list[dict]:
    return [e for e in spans if e.get("name") == name]


def _enclosing(spans: list[dict], inner: dict, tid: object = None) -> set[str]:
    """Names of the spans of inner's thread (or of thread `tid`) that contain it."""
    end, tid = inner["ts"] + inner["dur"], inner["tid"] if tid is None else tid
    return {e["name"] for e in spans if e is not inner and e["tid"] == tid
            and e["ts"] <= inner["ts"] and end <= e["ts"] + e["dur"]}


def _main_thread(spans: list[dict]) -> object:
    """The thread of the ProfilerStep markers: the training loop's."""
    return next(e["tid"] for e in spans if e["name"].startswith("ProfilerStep#"))


def _step(names: set[str]) -> int | None:
    steps = [int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#")]
    return steps[0] if len(steps) == 1 else None


def _path(spans: list[dict], inner: dict) -> tuple[str, ...]:
    """The job's annotations around `inner` on its thread, outermost first (not torch's: step
    markers, an async P2P's `gloo:send`), and its own name: where the job put it."""
    end = inner["ts"] + inner["dur"]
    around = [e for e in spans if e is not inner and e["tid"] == inner["tid"]
              and e.get("cat") == "user_annotation"
              and not e["name"].startswith(("ProfilerStep#", "gloo:"))
              and e["ts"] <= inner["ts"] and end <= e["ts"] + e["dur"]]
    return (*(e["name"] for e in sorted(around, key=lambda e: (e["ts"], -e["dur"]))),
            inner["name"])


def test_the_corpus_holds_every_case() -> None:
    assert set(CASES) == EXPECTED


@pytest.mark.parametrize("case", CASES)
def test_folder_holds_exactly_the_ranks_of_its_truth(case: str) -> None:
    t = truth(case)
    assert t["case"] == case
    assert {p.name for p in folder(case).iterdir()} == {"ground_truth.json", *t["files"].values()}
    assert t["files"] == {str(r): f"rank{r}.json.gz" for r in t["ranks"]}
    assert sorted(t["ranks"] + t["absent_ranks"]) == list(range(t["world_size"]))
    assert t["healthy"] == (not t["injections"])


@pytest.mark.parametrize("case", CASES)
def test_files_state_their_rank_and_the_groups_of_the_truth(case: str) -> None:
    t = truth(case)
    groups = {g["name"]: g for g in t["groups"]}
    assert "0" in groups and groups["0"]["ranks"] == list(range(t["world_size"]))
    listed: dict[str, list[int]] = {name: [] for name in groups}
    for rank in t["ranks"]:
        info = raw(case, rank)["distributedInfo"]
        assert (info["backend"], info["rank"], info["world_size"]) == (
            "gloo", rank, t["world_size"])
        assert info["pg_count"] == len(groups)
        for pg in info["pg_config"]:
            group = groups[pg["pg_name"]]
            assert (pg["pg_desc"], sorted(pg["ranks"])) == (group["desc"], group["ranks"])
            assert rank in group["ranks"]
            listed[pg["pg_name"]].append(rank)
    assert {name: g["listed_by"] for name, g in groups.items()} == listed
    assert {g["dim"] for g in t["groups"]} <= {"pp", "dp", "ep", "tp", "cp", "world"}


@pytest.mark.parametrize("case", CASES)
def test_tracegraph_loads_every_rank_with_the_profiled_steps(case: str, tmp_path: Path) -> None:
    t = truth(case)
    trace = tracegraph.load(folder(case), cache_dir=tmp_path)
    assert trace.rank_ids == t["ranks"]
    events = trace.events
    markers = events[events["name"].str.startswith("ProfilerStep#")]
    for rank in t["ranks"]:
        names = markers.loc[markers["rank"] == rank, "name"]
        assert sorted({int(n.split("#")[1]) for n in names}) == t["profiled_steps"], rank


@pytest.mark.parametrize("case", [c for c in CASES if not truth(c)["healthy"]])
def test_each_injection_lies_where_the_truth_says_on_its_rank_only(case: str) -> None:
    """Every injected sleep of the files is one the truth states: on its rank, in its steps, at
    each of its places (the annotations around it on its thread), at least 90 % as long; its
    places say what its fields say (inside, microbatches, layer, chunk, ring step)."""
    t = truth(case)
    stated: Counter = Counter()
    for inj in t["injections"]:
        if inj["annotation"] is None:
            continue  # a host stall: test_host_stall_is_a_gap_outside_any_annotation
        assert inj["places"] and all(p[-1] == inj["annotation"] for p in inj["places"])
        assert {p[-2] for p in inj["places"]} == _insides(inj)
        for key, word in (("layer", "layer={}"), ("chunk", "chunk={}"),
                          ("ring_step", "ring step {}")):
            if inj[key] is not None:
                assert all(word.format(inj[key]) in " ".join(p) for p in inj["places"]), key
        if inj["rank"] in t["ranks"]:
            stated.update((inj["rank"], step, tuple(place)) for step in inj["steps"]
                          for place in inj["places"])
    recorded: Counter = Counter()
    for rank in t["ranks"]:
        spans = _spans(raw(case, rank))
        for inj in t["injections"]:
            for sleep in _named(spans, inj["annotation"]) if inj["rank"] == rank else []:
                assert sleep["dur"] >= 0.9 * inj["duration_ms"] * 1e3
        names = {i["annotation"] for i in t["injections"]} - {None}
        for sleep in [e for e in spans if e["name"] in names]:
            # where the training loop was (a sleep on a second thread: at that time)
            step = _step(_enclosing(spans, sleep, _main_thread(spans)))
            recorded[rank, step, _path(spans, sleep)] += 1
    assert recorded == stated
    if t["absent_ranks"]:
        assert all(i["rank"] in t["absent_ranks"] for i in t["injections"])


def _insides(inj: dict) -> set[str]:
    """The annotations an injection states it sleeps in ("BWD mb=i": one per microbatch)."""
    if " mb=i" not in inj["inside"]:
        return {inj["inside"]}
    return {inj["inside"].replace(" mb=i", f" mb={mb}") for mb in inj["microbatches"]}


@pytest.mark.parametrize("case", [c for c in CASES if truth(c)["healthy"]])
def test_controls_hold_no_injected_annotation(case: str) -> None:
    t = truth(case)
    for rank in t["ranks"]:
        assert not {e["name"] for e in _spans(raw(case, rank))} & SLEEP_NAMES, rank


def test_host_stall_is_a_gap_outside_any_annotation() -> None:
    t = truth("dp4_host_stall")
    (inj,) = t["injections"]
    after, before = inj["between"]
    for rank in t["ranks"]:
        spans = _spans(raw("dp4_host_stall", rank))
        pairs = list(zip(_named(spans, after), _named(spans, before), strict=True))
        assert len(pairs) == len(t["profiled_steps"])
        for a, b in pairs:
            gap = (a["ts"] + a["dur"], b["ts"])
            if rank != inj["rank"]:
                assert gap[1] - gap[0] < 0.5 * inj["duration_ms"] * 1e3
                continue
            assert gap[1] - gap[0] >= 0.9 * inj["duration_ms"] * 1e3
            inside = [e["name"] for e in spans if e["tid"] == a["tid"]
                      and e.get("cat") == "user_annotation"
                      and e["ts"] < gap[1] and e["ts"] + e["dur"] > gap[0]]
            assert [n for n in inside if not n.startswith("ProfilerStep#")] == []


@pytest.mark.parametrize(("case", "source", "kept"), [
    ("pp2dp2_one_replica", "pp2dp2_wait_before_send", [0, 2]),
    ("pp4dp2_vpp_async_reduce_one_replica", "pp4dp2_vpp_async_reduce", [0, 2, 4, 6])])
def test_one_replica_is_a_byte_copy_of_its_recording(case: str, source: str, kept: list[int]
                                                     ) -> None:
    """One pipeline replica of a job, byte for byte; its truth is the job's for those ranks,
    the waits on the other replica's (absent) ranks charged to them."""
    t, whole = truth(case), truth(source)
    assert t["copied_from"] == source and case in COPIES
    assert t["ranks"] == kept and t["absent_ranks"] == sorted(set(whole["ranks"]) - set(kept))
    stages = [whole["parallelism"]["stage_of_rank"][str(r)] for r in kept]
    assert stages == list(range(whole["parallelism"]["pp"]))  # a whole pipeline replica
    for rank in t["ranks"]:
        name = f"rank{rank}.json.gz"
        assert (folder(case) / name).read_bytes() == (folder(source) / name).read_bytes()
    assert [{k: v for k, v in g.items() if k != "listed_by"} for g in t["groups"]] == [
        {k: v for k, v in g.items() if k != "listed_by"} for g in whole["groups"]]
    mine = {(w["rank"], w["step"], tuple(w["where"])): w for w in t["expected"]["waits"]}
    theirs = {(w["rank"], w["step"], tuple(w["where"])): w for w in whole["expected"]["waits"]
              if w["rank"] in kept}
    assert mine.keys() == theirs.keys()
    for key, wait in mine.items():  # the same wait, explained up to the first absent rank
        assert wait["ms"] == theirs[key]["ms"]
        absent = [c for c in wait["causes"] if c["cause"] == "absent"]
        assert all(c["rank"] in t["absent_ranks"] for c in absent)
        assert wait["chain"] == theirs[key]["chain"][:len(wait["chain"])]
