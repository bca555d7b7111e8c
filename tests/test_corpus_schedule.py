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
