"""The corpus' ground truth against itself and against the recorded files (tests/data/corpus,
bench/record_corpus.py): every stated wait adds up and names a group of the job, a batched P2P
call is held by the half the truth says (the peers' own posts in the files show it), per-step
stragglers are the injected ones, and the new schedules are in the files as the truth describes
them (interleaved 1F1B as Megatron counts it, two groups of 2 per rank, a CP ring, TP
all_reduces, replica A alone blocked on its absent DP peers).

These test the recordings and their truth, not tracegraph's verdicts on them."""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import median

import pytest

from tests.corpus import CASES, raw, span_at, truth
from tracegraph import causes

P2P_OPS = {"send", "recv", "exchange"}
VPP = ["pp4dp2_vpp_async_reduce", "pp4dp2_vpp_wait_before_send",
       "pp4dp2_vpp_async_reduce_one_replica"]


def _waits(case: str) -> list[dict]:
    return truth(case)["expected"]["waits"]


def _events(case: str, rank: int) -> list[dict]:
    return [e for e in raw(case, rank)["traceEvents"] if e.get("ph") == "X"]


def _inside(events: list[dict], span: dict, name: str) -> list[dict]:
    """Events called `name` on span's thread within it."""
    end = span["ts"] + span["dur"]
    return [e for e in events if e["name"] == name and e["tid"] == span["tid"]
            and span["ts"] <= e["ts"] <= end]


def _peer(op: dict) -> int:
    """A c10d::send / recv_'s peer: its group-local rank (Concrete Inputs)."""
    return int(op["args"]["Concrete Inputs"][2])


# --- every case: the stated waits ---------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_every_wait_adds_up_to_its_causes_and_ends_its_chain_at_its_root(case: str) -> None:
    t = truth(case)
    expected = t["expected"]
    for w in expected["waits"]:
        assert w["rank"] in t["ranks"] and w["step"] in t["profiled_steps"], w
        assert abs(sum(c["ms"] for c in w["causes"]) - w["ms"]) <= 0.1 * len(w["causes"]), w
        by_category: Counter = Counter()
        for c in w["causes"]:
            by_category[c["category"]] += c["ms"]
            assert c["category"] in causes.CATEGORIES, c
        assert by_category[w["category"]] == max(by_category.values()), w
        assert w["chain"][0] == w["rank"]
        assert w["root_rank"] is None or w["chain"][-1] == w["root_rank"], w
        assert set(w["via"]) <= set(expected["comm_categories"]), w


@pytest.mark.parametrize("case", CASES)
def test_every_communication_wait_names_a_group_of_its_rank(case: str) -> None:
    """gloo names no op's group: the truth does, from the job (torch's pg_name)."""
    groups = {g["name"]: g for g in truth(case)["groups"]}
    for w in _waits(case):
        if w["op"] == "idle" or w["op"] in ("fork", "join"):
            assert w["group"] is None, w
            continue
        group = groups[w["group"]]
        assert w["rank"] in group["ranks"], w
        if w["op"] in P2P_OPS:
            assert {"send", "recv"} <= set(group["comms"]), (w, group)
        elif w["op"] != "wait":
            assert w["op"] in group["comms"] or group["dim"] == "world", (w, group)


@pytest.mark.parametrize("case", CASES)
def test_a_batched_call_states_its_halves_and_the_one_released_last(case: str) -> None:
    groups = {g["name"]: g for g in truth(case)["groups"]}
    for w in _waits(case):
        if "halves" not in w:
            assert w["op"] not in P2P_OPS or w["op"] != "exchange", w
            continue
        halves = sorted(w["halves"], key=lambda h: -h["released_ms"])
        assert len(halves) >= 2 and {h["half"] for h in halves} <= {"send", "recv"}
        assert all(h["peer"] in groups[w["group"]]["ranks"] for h in halves), w
        assert abs(halves[0]["released_ms"] - w["ms"]) <= 0.1, w  # the last one let it go
        alone = halves[0]["released_ms"] - halves[1]["released_ms"] >= 0.5
        bound = {"half": halves[0]["half"], "peer": halves[0]["peer"]}
        assert w["bound"] == (bound if alone else None), w


@pytest.mark.parametrize("case", CASES)
def test_a_batched_call_is_held_by_the_half_the_truth_says(case: str) -> None:
    """Where the truth says one half was released 20 ms or more after the others, the files
    agree: that half's peer entered the call that released it after the other halves' peers
    entered theirs (one host clock). The `gloo:send` / `gloo:recv` spans of the waiting call
    last until the whole batch completes, so only the peers show which half held it."""
    for w in _waits(case):
        if not w.get("bound"):
            continue
        last, *others = sorted(w["halves"], key=lambda h: -h["released_ms"])
        if last["released_ms"] - others[0]["released_ms"] < 20:
            continue
        posted = [span_at(case, h["peer"], h["by"]["step"], h["by"]["where"])["ts"]
                  for h in (last, *others)] if last["peer"] in truth(case)["ranks"] else []
        assert not posted or all(posted[0] > p for p in posted[1:]), (w, posted)


@pytest.mark.parametrize("case", CASES)
def test_where_halves_tie_the_chain_follows_the_peer_that_posted_last(case: str) -> None:
    """Where the schedule releases a batched call's halves together (no `bound`), which peer
    came last is noise: the truth's chain goes through the one whose c10d op of the match
    started last in the files."""
    groups = {g["name"]: g for g in truth(case)["groups"]}
    for w in _waits(case):
        peers = {h["peer"] for h in w.get("halves", ())}
        if w.get("bound", 1) is not None or len(peers) < 2 or w["ms"] < 20:
            continue
        local = groups[w["group"]]["ranks"].index
        posted = {}
        for h in w["halves"]:
            events = _events(case, h["peer"])
            call = span_at(case, h["peer"], h["by"]["step"], h["by"]["where"])
            name = "c10d::recv_" if h["half"] == "send" else "c10d::send"
            (op,) = [o for o in _inside(events, call, name) if _peer(o) == local(w["rank"])]
            posted[h["peer"]] = op["ts"]
        assert w["chain"][1] == max(posted, key=posted.get), (w, posted)


@pytest.mark.parametrize("case", CASES)
def test_per_step_stragglers_are_the_injected_ones(case: str) -> None:
    """A rank whose declared work in a step is twice its peers' median is a straggler there:
    only where a sleep was injected on that rank in that step."""
    injected = {(i["rank"], s) for i in truth(case)["injections"] for s in i["steps"]}
    for s in truth(case)["expected"]["stragglers"]:
        assert (s["rank"], s["step"]) in injected, s
        assert s["ms"] >= 2 * s["peers_median_ms"] > 0


# --- a different rank in each step ----------------------------------------------------------------
def test_the_rotating_straggler_is_a_different_rank_each_step_and_5x_its_peers() -> None:
    """dp4_rotating_straggler: each profiled step's straggler is the rank the truth names, its
    FWD in the files at least twice its peers' median that step; over the steps every rank is
    one once, so no rank is slow on average."""
    case = "dp4_rotating_straggler"
    t = truth(case)
    table = {s["step"]: s for s in t["expected"]["stragglers"]}
    assert sorted(table) == t["profiled_steps"]
    assert sorted(s["rank"] for s in table.values()) == t["ranks"]
    assert all(s["ratio"] == pytest.approx(5.0) for s in table.values())
    fwd: dict[int, dict[int, float]] = defaultdict(dict)
    for rank in t["ranks"]:
        for step in t["profiled_steps"]:
            fwd[step][rank] = span_at(case, rank, step, ["FWD"])["dur"]
    for step, ms in fwd.items():
        slow = table[step]["rank"]
        assert ms[slow] >= 2 * median(v for r, v in ms.items() if r != slow), (step, ms)
    totals = {r: sum(fwd[s][r] for s in fwd) for r in t["ranks"]}
    assert max(totals.values()) < 1.5 * min(totals.values())
    assert {w["root_rank"] for w in t["expected"]["waits"] if w["ms"] >= 100} == set(t["ranks"])


# --- interleaved pipeline ---------------------------------------------------------------------
@pytest.mark.parametrize("case", VPP)
def test_interleaved_blocks_are_labelled_and_warm_up_as_megatron_counts(case: str) -> None:
    """Every rank runs each (chunk, microbatch)'s forward and backward once per step, in
    `FWD chunk=c mb=i` / `BWD chunk=c mb=i`, and as many forwards before its first backward as
    Megatron's interleaved schedule warms up, (P - s - 1) * 2 + (V - 1) * P, and the steady
    state's first (all of them on a stage that warms up with all)."""
    t = truth(case)
    par = t["parallelism"]
    pp, chunks, mbs = par["pp"], par["chunks"], par["microbatches"]
    assert par["schedule"] == "interleaved" and chunks == 2
    for rank in t["ranks"]:
        stage = par["stage_of_rank"][str(rank)]
        events = _events(case, rank)
        for step in t["profiled_steps"]:
            (marker,) = [e for e in events if e["name"] == f"ProfilerStep#{step}"]
            blocks = sorted((e for e in events
                             if e["name"].startswith(("FWD chunk=", "BWD chunk="))
                             and marker["ts"] <= e["ts"] <= marker["ts"] + marker["dur"]),
                            key=lambda e: e["ts"])
            names = [e["name"] for e in blocks]
            want = {f"{kind} chunk={c} mb={i}" for kind in ("FWD", "BWD")
                    for c in range(chunks) for i in range(mbs)}
            assert sorted(names) == sorted(want), (rank, step)
            assert all(names.index(f"FWD{n[3:]}") < names.index(n) for n in names
                       if n.startswith("BWD"))
            warm = min((pp - stage - 1) * 2 + (chunks - 1) * pp + 1, chunks * mbs)
            assert names.index(next(n for n in names if n.startswith("BWD"))) == warm


@pytest.mark.parametrize("case", VPP[:2])
def test_interleaved_p2p_batches_hold_a_send_and_a_recv_to_different_peers(case: str) -> None:
    """Megatron's batched calls on the PP ring (stage 0's previous is the last stage): on every
    rank some call posts a send and a receive to two different peers."""
    t = truth(case)
    for rank in t["ranks"]:
        events = _events(case, rank)
        mixed = 0
        for call in [e for e in events if e["name"].startswith(("SEND_", "RECV_"))]:
            sends = {_peer(o) for o in _inside(events, call, "c10d::send")}
            recvs = {_peer(o) for o in _inside(events, call, "c10d::recv_")}
            mixed += bool(sends and recvs and sends != recvs)
        assert mixed, rank


def test_the_seed_bug_interleaved_holds_rank_0_by_its_send_to_the_last_stage() -> None:
    """pp4dp2_vpp_wait_before_send: rank 0's batched call is held ~200 ms by its send to rank
    6 (the last stage, itself waiting on its DP reduction with the late rank 7), its receive
    from rank 2 released long before; the truth's chain follows the send."""
    case = "pp4dp2_vpp_wait_before_send"
    held = [w for w in _waits(case) if w["rank"] == 0 and w["ms"] >= 100]
    assert held and all(w["bound"] == {"half": "send", "peer": 6} for w in held)
    for w in held:
        recv = next(h for h in w["halves"] if h["half"] == "recv")
        assert (recv["peer"], w["chain"], w["root_rank"]) == (2, [0, 6, 7], 7)
        assert recv["released_ms"] <= w["ms"] - 100
        six = span_at(case, 6, w["step"], ["BWD chunk=1 mb=3", "DP_GRAD_WAIT chunk=1"])
        assert six["dur"] >= 0.5 * truth(case)["injections"][0]["duration_ms"] * 1e3


def test_one_replica_blocks_every_rank_on_its_absent_dp_peer_before_the_optimizer() -> None:
    """pp4dp2_vpp_async_reduce_one_replica: each profiled rank's long waits are the wait for
    chunk 0's reduction in FINALIZE_GRADS, on its absent DP peer (the group to profile), about
    the injected delay in the files; the reduction was launched long before the wait."""
    case = "pp4dp2_vpp_async_reduce_one_replica"
    t = truth(case)
    delay = t["injections"][0]["duration_ms"]
    groups = {g["name"]: g for g in t["groups"]}
    long = [w for w in _waits(case) if w["ms"] >= 0.5 * delay]
    assert {(w["rank"], w["step"]) for w in long} == {
        (r, s) for r in t["ranks"] for s in t["profiled_steps"]}
    for w in long:
        assert w["where"] == ["FINALIZE_GRADS", "DP_GRAD_WAIT chunk=0"]
        (peer,) = set(groups[w["group"]]["ranks"]) - {w["rank"]}
        assert groups[w["group"]]["dim"] == "dp" and peer in t["absent_ranks"]
        assert w["causes"][0]["cause"] == "absent" and w["root_rank"] == peer
        wait = span_at(case, w["rank"], w["step"], w["where"])
        assert wait["dur"] >= 0.5 * delay * 1e3
        launch = span_at(case, w["rank"], w["step"], ["BWD chunk=0 mb=3",
                                                       "DP_REDUCE_GRAD chunk=0"])
        assert launch["ts"] + launch["dur"] < wait["ts"]


# --- groups of the same size -------------------------------------------------------------------
def test_embedding_groups_every_rank_reduces_on_two_groups_of_two() -> None:
    """pp2dp2_embedding_groups: each rank all_reduces on its DP group and on its embedding
    group (first and last stage: the PP group's members), both of 2 ranks; the DP wait names
    the DP group, the embedding waits the embedding group; in the files the embedding
    all_reduce is the same size on both stages, the DP one is not (stage 0 has a layer
    more)."""
    case = "pp2dp2_embedding_groups"
    t = truth(case)
    groups = {g["name"]: g for g in t["groups"]}
    reducing = [g for g in t["groups"] if "allreduce" in g["comms"] and g["dim"] != "world"]
    for rank in t["ranks"]:
        mine = [g for g in reducing if rank in g["ranks"]]
        assert sorted((g["desc"], len(g["ranks"])) for g in mine) == [
            ("DATA_PARALLEL_GROUP", 2), ("EMBEDDING_GROUP", 2)]
    descs = {"DP_GRAD_ALLREDUCE": "DATA_PARALLEL_GROUP",
             "EMBEDDING_GRAD_ALLREDUCE": "EMBEDDING_GROUP"}
    waits = [w for w in _waits(case) if w["op"] == "allreduce"]
    assert {w["where"][-1] for w in waits if w["ms"] >= 100} == set(descs)
    for w in waits:
        assert groups[w["group"]]["desc"] == descs[w["where"][-1]], w
    dims: dict[str, set] = defaultdict(set)
    for rank in t["ranks"]:
        events = _events(case, rank)
        for name in descs:
            for span in [e for e in events if e["name"] == name]:
                (op,) = _inside(events, span, "c10d::allreduce_")
                dims[name].add(str(op["args"]["Input Dims"][0]))
    assert len(dims["EMBEDDING_GRAD_ALLREDUCE"]) == 1 and len(dims["DP_GRAD_ALLREDUCE"]) == 2


# --- a ring without a pipeline -------------------------------------------------------------------
def test_cp_ring_exchanges_with_both_ring_neighbours_in_each_step() -> None:
    """cp4_ring: in every forward ring step but the last each rank posts one send to the next
    rank and one receive from the previous (the CP group is the world: its local ranks are
    global), no pipeline; the truth charges the ring to cp_collective, never pp_p2p."""
    case = "cp4_ring"
    t = truth(case)
    assert (t["parallelism"]["pp"], t["parallelism"]["cp"]) == (1, 4)
    assert "cp_collective" in t["expected"]["comm_categories"]
    assert "pp_p2p" not in t["expected"]["comm_categories"]
    size = t["parallelism"]["cp"]
    for rank in t["ranks"]:
        events = _events(case, rank)
        for step in t["profiled_steps"]:
            for k in range(size - 1):
                ring = span_at(case, rank, step, ["FWD", "attention layer=0", f"ring step {k}"])
                assert [_peer(o) for o in _inside(events, ring, "c10d::send")] == [
                    (rank + 1) % size]
                assert [_peer(o) for o in _inside(events, ring, "c10d::recv_")] == [
                    (rank - 1) % size]
    bound = {(w["rank"], w["bound"]["half"]) for w in _waits(case)
             if w.get("bound") and w["ms"] >= 100}
    assert {(1, "send"), (3, "recv")} <= bound  # rank 2 late: its senders and receivers wait


# --- tensor parallelism -----------------------------------------------------------------------
def test_tp_allreduces_sit_in_each_layer_and_the_tp_peer_waits_there() -> None:
    """tp2pp2dp2_tp_straggler: every TP_ALLREDUCE annotation holds one all_reduce; rank 4 (rank
    5's TP peer) waits in TP_ALLREDUCE layer=0 of FWD mb=1 on the TP group, about the injected
    delay in the files."""
    case = "tp2pp2dp2_tp_straggler"
    t = truth(case)
    groups = {g["name"]: g for g in t["groups"]}
    for rank in t["ranks"]:
        events = _events(case, rank)
        spans = [e for e in events if e["name"].startswith("TP_ALLREDUCE layer=")]
        assert spans and all(len(_inside(events, s, "c10d::allreduce_")) == 1 for s in spans)
    (inj,) = t["injections"]
    tp_waits = [w for w in _waits(case) if w["ms"] >= 100 and w["where"][-1].startswith("TP_")]
    assert {(w["rank"], tuple(w["where"])) for w in tp_waits} == {
        (4, ("FWD mb=1", "TP_ALLREDUCE layer=0"))}
    for w in tp_waits:
        assert groups[w["group"]]["dim"] == "tp" and groups[w["group"]]["ranks"] == [4, 5]
        assert span_at(case, 4, w["step"], w["where"])["dur"] >= 0.5 * inj["duration_ms"] * 1e3
