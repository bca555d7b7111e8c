"""The schedule replay that writes the corpus' ground truth (bench/corpus_schedule.py), on small
programs whose waits are known by hand: a late sender, a collective's last member, a second
thread, time before a peer's profile began, a rank absent from the bundle. It needs no torch:
the recorder's plan mode produces the same kind of programs from the real jobs."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO

_SPEC = importlib.util.spec_from_file_location("corpus_schedule",
                                               REPO / "bench" / "corpus_schedule.py")
cs = sys.modules.setdefault("corpus_schedule", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(cs)
Act = cs.Act
SLEEP = [{"annotation": "straggler_sleep", "root_category": "compute_straggler"}]
STALL = [{"annotation": None, "root_category": "host_launch"}]


def step(n: int) -> Act:
    return Act("step", n, ())


def programs_of(*ranks: list[Act]) -> dict[int, list[Act]]:
    return cs.lanes(dict(enumerate(ranks)))


def stated(programs: dict[int, list[Act]], injections: list[dict] = SLEEP, profiled=(0,),
           absent: set[int] = frozenset()) -> list[dict]:
    replayed = cs.replay(programs, list(profiled))
    return cs.stated_waits(replayed, list(profiled), injections, "pipeline_fill", absent)


def test_a_receiver_waits_for_a_late_sender_and_the_sleep_explains_it() -> None:
    recv = Act("p2p", 0, ("BWD mb=0", "BWD_RECV"), recvs=(1,), comm="recv", category="pp_p2p")
    send = Act("p2p", 0, ("BWD mb=0", "BWD_SEND"), sends=(0,), comm="send", category="pp_p2p")
    (wait,) = stated(programs_of(
        [step(0), Act("compute", 0, ("FWD",), ms=5), recv, step(1)],
        [step(0), Act("sleep", 0, ("BWD mb=0",), ms=40, injection=0), send, step(1)]))
    assert (wait["rank"], wait["where"], wait["op"], wait["ms"]) == (
        0, ["BWD mb=0", "BWD_RECV"], "recv", 35.0)  # its own 5 ms of work came first
    assert (wait["category"], wait["root_rank"], wait["chain"]) == ("compute_straggler", 1, [0, 1])
    assert wait["causes"] == [{"cause": "injected", "rank": 1, "category": "compute_straggler",
                               "ms": 35.0}]
    assert wait["via"] == ["pp_p2p"]


def test_a_collective_waits_for_its_last_member_and_then_its_transfer() -> None:
    def member(delay: float) -> list[Act]:
        work = [Act("compute", 0, ("BWD",), ms=delay)] if delay else []
        return [step(0), *work, Act("collective", 0, ("DP allreduce",), members=(0, 1, 2),
                                    comm="allreduce", ms=3, category="dp_reduction"), step(1)]

    waits = {w["rank"]: w for w in stated(programs_of(member(0), member(20), member(8)))}
    assert set(waits) == {0, 1, 2}
    assert waits[0]["ms"] == 23.0 and waits[2]["ms"] == 15.0 and waits[1]["ms"] == 3.0
    assert waits[0]["category"] == "pipeline_fill" and waits[0]["root_rank"] == 1
    assert waits[0]["causes"] == [
        {"cause": "compute", "rank": 1, "category": "pipeline_fill", "ms": 20.0},
        {"cause": "transfer", "rank": 0, "category": "dp_reduction", "ms": 3.0}]
    assert waits[1]["category"] == "dp_reduction" and waits[1]["root_rank"] is None


def test_an_async_reduction_waited_for_on_the_main_thread_is_released_by_the_late_member() -> None:
    launch = Act("collective", 0, ("DP_REDUCE_GRAD",), members=(0, 1), comm="allreduce",
                 handle=1, blocking=False, category="dp_reduction")
    wait = Act("wait", 0, ("DP_GRAD_WAIT",), handle=1, category="dp_reduction")
    late = Act("sleep", 0, ("DP_REDUCE_GRAD",), ms=30, injection=0)
    (on_0,) = stated(programs_of([step(0), launch, Act("compute", 0, ("WORK",), ms=10), wait,
                                  step(1)],
                                 [step(0), late, launch, wait, step(1)]))
    assert (on_0["rank"], on_0["where"], on_0["ms"], on_0["root_rank"]) == (
        0, ["DP_GRAD_WAIT"], 20.0, 1)


def test_a_second_thread_runs_beside_the_main_one() -> None:
    """The seed's fix: the late reduction runs on a second thread while the main thread works;
    the main thread's join waits only for what outlasts its work."""
    fork_main = Act("p2p", 0, (), sends=(cs.SIDE,), comm="fork")
    join_main = Act("p2p", 0, ("DP_GRAD_WAIT",), recvs=(cs.SIDE,), comm="join")
    side = [Act("p2p", 0, (), 1, recvs=(0,), comm="fork"),
            Act("sleep", 0, ("DP_REDUCE_GRAD",), 1, ms=30, injection=0),
            Act("p2p", 0, (), 1, sends=(0,), comm="join")]
    programs = cs.lanes({0: [step(0), fork_main, *side, Act("compute", 0, ("LOCAL_WORK",),
                                                            ms=50), join_main, step(1)]})
    assert set(programs) == {0, cs.SIDE}
    assert stated(programs) == []  # 50 ms of work hide the 30 ms sleep
    programs = cs.lanes({0: [step(0), fork_main, *side, Act("compute", 0, ("LOCAL_WORK",),
                                                            ms=10), join_main, step(1)]})
    (join,) = stated(programs)
    assert (join["ms"], join["root_rank"], join["chain"]) == (20.0, 0, [0])


def test_time_before_a_peers_profile_is_unrecorded() -> None:
    """Rank 1 enters the profiled step 1 after 40 ms of step 0 (not profiled); rank 0, already
    in step 1, waits for it: what rank 1 did then is in no file."""
    recv = Act("p2p", 1, ("FWD mb=0", "FWD_RECV"), recvs=(1,), comm="recv", category="pp_p2p")
    send = Act("p2p", 1, ("FWD mb=0", "FWD_SEND"), sends=(0,), comm="send", category="pp_p2p")
    (wait,) = stated(programs_of(
        [step(0), step(1), recv, step(2)],
        [step(0), Act("sleep", 0, ("BWD",), ms=40, injection=0), step(1), send, step(2)]),
        profiled=(1,))
    assert (wait["step"], wait["category"], wait["root_rank"], wait["ms"]) == (
        1, "unknown", 1, 40.0)
    assert wait["causes"][0]["cause"] == "unrecorded"


def test_a_wait_on_an_absent_rank_is_its_communication() -> None:
    reduce = Act("collective", 0, ("DP allreduce",), members=(0, 1), comm="allreduce",
                 category="dp_reduction")
    waits = stated(programs_of([step(0), reduce, step(1)],
                               [step(0), Act("sleep", 0, (), ms=25, injection=0), reduce,
                                step(1)]), injections=STALL, absent={1})
    (wait,) = [w for w in waits if w["rank"] == 0]  # the recorder keeps the bundle's ranks
    assert (wait["category"], wait["root_rank"], wait["chain"]) == ("dp_reduction", 1, [0, 1])
    assert wait["causes"][0]["cause"] == "absent"


def test_a_host_stall_is_stated_where_it_happens() -> None:
    reduce = Act("collective", 0, ("DP allreduce",), members=(0, 1), comm="allreduce",
                 category="collective")
    waits = stated(programs_of([step(0), Act("sleep", 0, (), ms=25, injection=0), reduce,
                                step(1)], [step(0), reduce, step(1)]), injections=STALL)
    assert [(w["rank"], w["op"], w["category"], w["root_rank"]) for w in waits] == [
        (0, "idle", "host_launch", 0), (1, "allreduce", "host_launch", 0)]


def test_a_schedule_that_cannot_finish_is_refused() -> None:
    recv = Act("p2p", 0, (), recvs=(1,), comm="recv")
    with pytest.raises(RuntimeError, match="deadlocks"):
        cs.replay(programs_of([step(0), recv], [step(0), recv]), [0])


def test_a_batched_call_is_held_by_its_half_released_last() -> None:
    """Rank 0 sends to 1 and receives from 2 in one batch; 2 sent at once, 1 posts its receive
    30 ms late: the send half binds, the chain follows it, the receive half is stated released
    at once by rank 2's call."""
    batch = Act("p2p", 0, ("BWD", "SEND_RECV"), sends=(1,), recvs=(2,), comm="exchange",
                category="pp_p2p", members=(0, 1, 2), group="PP")
    late_recv = Act("p2p", 0, ("FWD", "RECV"), recvs=(0,), comm="recv", category="pp_p2p")
    send = Act("p2p", 0, ("FWD", "SEND"), sends=(0,), comm="send", category="pp_p2p")
    waits = cs.stated_waits(
        cs.replay(programs_of([step(0), batch, step(1)],
                              [step(0), Act("sleep", 0, ("FWD",), ms=30, injection=0),
                               late_recv, step(1)],
                              [step(0), send, step(1)]), [0]),
        [0], SLEEP, "pipeline_fill", group_name=lambda desc, members: f"{desc}{members}")
    (wait,) = [w for w in waits if w["rank"] == 0]
    assert (wait["ms"], wait["root_rank"], wait["chain"]) == (30.0, 1, [0, 1])
    assert wait["bound"] == {"half": "send", "peer": 1}
    assert wait["halves"] == [
        {"half": "send", "peer": 1, "released_ms": 30.0,
         "by": {"step": 0, "where": ["FWD", "RECV"]}},
        {"half": "recv", "peer": 2, "released_ms": 0.0,
         "by": {"step": 0, "where": ["FWD", "SEND"]}}]
    assert wait["group"] == "PP(0, 1, 2)"


def test_an_async_exchange_is_waited_for_where_its_wait_is() -> None:
    """A ring step: the exchange is launched, the rank computes 10 ms, then waits; its peer
    posts 25 ms late: 15 ms of wait, in the step's annotation, held by the late half."""
    def ring(peer: int, late: float) -> list[Act]:
        launch = Act("p2p", 0, ("ring step 0",), sends=(peer,), recvs=(peer,), comm="exchange",
                     handle=1, blocking=False, category="cp_collective")
        work = [Act("sleep", 0, ("ring step 0", "ATTENTION"), ms=late, injection=0)]
        return [step(0), *(work if late else []), launch,
                Act("compute", 0, ("ring step 0", "ATTENTION"), ms=10),
                Act("wait", 0, ("ring step 0",), handle=1, category="cp_collective"), step(1)]

    waits = stated(programs_of(ring(1, 0), ring(0, 25)))
    (wait,) = waits
    assert (wait["rank"], wait["op"], wait["where"], wait["ms"]) == (0, "wait", ["ring step 0"],
                                                                     15.0)
    assert (wait["category"], wait["root_rank"], wait["via"]) == (
        "compute_straggler", 1, ["cp_collective"])
    assert wait["bound"] is None  # both halves are rank 1's, posted at once
    assert [h["released_ms"] for h in wait["halves"]] == [15.0, 15.0]


def test_a_straggler_is_twice_its_peers_median_of_declared_work() -> None:
    def member(extra: float) -> list[Act]:
        sleep = [Act("sleep", 1, ("FWD",), ms=extra, injection=0)] if extra else []
        return [step(1), Act("compute", 1, ("FWD",), ms=30), *sleep,
                Act("compute", 1, ("BWD",), ms=5 + extra / 100), step(2)]

    table = cs.stragglers(programs_of(member(0), member(120), member(10), member(0)), [1])
    assert table == [{"step": 1, "rank": 1, "annotation": "FWD", "ms": 150.0,
                      "peers_median_ms": 30.0, "ratio": 5.0}]  # BWD 6.2 ms: not twice 5


def test_halves_released_together_follow_the_peer_the_recording_shows_last() -> None:
    """Rank 0's batch sends to 1 and receives from 2; both peers post 20 ms late (the same
    sleep before a shared collective, in the replay to the microsecond): the schedule cannot
    say which came last, so the chain goes through the one the recording shows posting last."""
    batch = Act("p2p", 0, ("B",), sends=(1,), recvs=(2,), comm="exchange", category="pp_p2p")
    late = Act("sleep", 0, ("S",), ms=20, injection=0)
    programs = programs_of([step(0), batch, step(1)],
                           [step(0), late, Act("p2p", 0, ("R",), recvs=(0,), comm="recv"),
                            step(1)],
                           [step(0), late, Act("p2p", 0, ("X",), sends=(0,), comm="send"),
                            step(1)])
    chains = {}
    for later in (1, 2):
        replayed = cs.replay(programs, [0])
        replayed.recorded = lambda lane, timed, key, later=later: float(lane == later)
        (wait,) = [w for w in cs.stated_waits(replayed, [0], SLEEP, "pipeline_fill")
                   if w["rank"] == 0]
        assert wait["bound"] is None and wait["root_rank"] == later
        chains[later] = wait["chain"]
    assert chains == {1: [0, 1], 2: [0, 2]}
