"""The schedule of a recorded corpus job, replayed: where each rank waits, on whom, and why.

bench/record_corpus.py runs every rank's job once more without torch.distributed ("plan" mode)
and keeps what each rank does, in order, with the annotations around it: `Act`s (compute, an
injected sleep, a P2P send / receive / exchange, a collective, the wait of an async one, a step
boundary). `replay` runs those programs against each other with the job's own semantics
(gloo P2P is a rendezvous: both halves complete when the later one is posted; a collective
completes when its last member arrives, plus its declared transfer time) and the durations the
job declares (each injected sleep, each fixed-duration work block; everything else is taken as
instantaneous, which it nearly is next to the injections). `explain` then decomposes every wait
backward along what it waited for, exactly as the job made it happen: an injected sleep, a
peer's declared work, a transfer, or time before a rank's profile window began (the profiler
records only the active steps, which each rank enters on its own: what a rank did before its
window is not in any file). This is the ground truth that ground_truth.json states for every
wait: it comes from the job's code, never from tracegraph.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median

from tracegraph.causes import root_of

TRANSFER, COMPUTE, UNRECORDED, INJECTED = "transfer", "compute", "unrecorded", "injected"
ABSENT = "absent"  # waiting on a rank whose profile is not in the bundle
BLOCKING = ("p2p", "collective", "wait")
SIDE = 1000  # lane id of a rank's second thread: SIDE + rank (its main thread's is the rank)
MIN_WAIT_MS = 0.5  # waits shorter than this in the replay are not listed
STRAGGLER_RATIO = 2.0  # a rank's declared work in a block this many times its peers' median


@dataclass(frozen=True)
class Act:
    """One thing a rank's program does, in order."""

    kind: str  # step | compute | sleep | p2p | collective | wait (for an async p2p / collective)
    step: int
    where: tuple[str, ...]  # the record_function annotations around it, outermost first
    thread: int = 0  # 0: the rank's main thread; 1: a second thread (lane SIDE + rank)
    ms: float = 0.0  # compute / sleep: its duration; collective: its transfer time
    injection: int = -1  # sleep: index of the case's injection
    sends: tuple[int, ...] = ()  # p2p: lanes it sends to (another rank's main thread: the
    recvs: tuple[int, ...] = ()  # rank) and receives from; fork / join: its own other thread
    members: tuple[int, ...] = ()  # collective, p2p, wait: its group's global ranks
    comm: str = ""  # collective: allreduce | alltoall; p2p: send | recv | exchange | fork | join
    handle: int = -1  # async p2p / collective (and the wait for it): an id unique on the rank
    blocking: bool = True  # p2p / collective: synchronous, or launched async (then a `wait`)
    category: str = ""  # the category its transfer is charged to (comm acts)
    group: str = ""  # comm acts: its group's desc (with `members`, it names the group)


@dataclass
class Timed:
    act: Act
    start: float  # when the rank reached it (a blocking act: posted)
    end: float  # when it let the rank go on (a blocking act: completed)
    keys: tuple = ()  # the matches it waits for: ("p2p", src, dst, n) / ("coll", members, n)


@dataclass
class Piece:
    """A stretch of a wait explained by one cause."""

    cause: str  # injected | compute | transfer | unrecorded | absent
    rank: int  # whose injection, work, late window or absence; a transfer's: the waiting rank
    start: float
    end: float
    injection: int = -1
    category: str = ""
    path: tuple[int, ...] = ()  # the ranks the explanation went through to it, waiter first
    via: tuple[str, ...] = ()  # the categories of the comm ops it went through

    @property
    def ms(self) -> float:
        return self.end - self.start


Recorded = Callable[[int, "Timed", tuple], "float | None"]
"""When the recording shows a lane's act posting its half of a P2P match (None: not shown)."""


@dataclass
class Replay:
    """Every lane's program with replayed times, and each rank's profile window."""

    timeline: dict[int, list[Timed]]  # lane -> its acts
    window: dict[int, tuple[float, float]]  # rank -> (start, end)
    posts: dict[tuple, dict[int, float]] = field(default_factory=dict)
    transfer: dict[tuple, float] = field(default_factory=dict)  # collective key -> its ms
    posted_by: dict[tuple, dict[int, Timed]] = field(default_factory=dict)  # key -> lane -> act
    recorded: Recorded | None = None  # when the files show a P2P half posted (breaks ties)

    def released(self, key: tuple) -> float:
        """When a match completed: its last party's post, plus a collective's transfer."""
        return max(self.posts[key].values()) + self.transfer.get(key, 0.0)


def rank_of(lane: int) -> int:
    return lane % SIDE


def lanes(acts_of_rank: dict[int, list[Act]]) -> dict[int, list[Act]]:
    """Each rank's acts split into its threads' programs, keyed by lane."""
    out: dict[int, list[Act]] = {}
    for rank, acts in acts_of_rank.items():
        for act in acts:
            out.setdefault(rank + SIDE * act.thread, []).append(act)
    return out


def replay(programs: dict[int, list[Act]], profiled: list[int]) -> Replay:
    """Run the lanes' programs against each other; raise on a deadlock (a schedule bug)."""
    keys = _keys(programs)
    posts: dict[tuple, dict[int, float]] = defaultdict(dict)
    transfer: dict[tuple, float] = {}
    done: dict[tuple, float] = {}
    clock = dict.fromkeys(programs, 0.0)
    pc = dict.fromkeys(programs, 0)
    timeline: dict[int, list[Timed]] = {r: [] for r in programs}
    handles: dict[tuple[int, int], tuple[tuple, ...]] = {}
    while any(pc[r] < len(programs[r]) for r in programs):
        moved = False
        for r, acts in programs.items():
            while pc[r] < len(acts):
                act, mine, now = acts[pc[r]], keys[r][pc[r]], clock[r]
                for key in mine:
                    posts[key].setdefault(r, now)
                    if act.kind == "collective":
                        transfer[key] = max(transfer.get(key, 0.0), act.ms)
                if act.kind in ("collective", "p2p") and not act.blocking:
                    handles[rank_of(r), act.handle] = mine
                    timeline[r].append(Timed(act, now, now, mine))
                    pc[r] += 1
                    moved = True
                    continue
                waits_for = handles[rank_of(r), act.handle] if act.kind == "wait" else mine
                ends = [_completion(key, posts, transfer, programs, done) for key in waits_for]
                if any(e is None for e in ends):
                    break
                end = max([now + act.ms if act.kind in ("compute", "sleep") else now, *ends])
                timeline[r].append(Timed(act, now, end, waits_for))
                clock[r] = end
                pc[r] += 1
                moved = True
        if not moved:
            stuck = {r: programs[r][pc[r]] for r in programs if pc[r] < len(programs[r])}
            raise RuntimeError(f"the schedule deadlocks: {stuck}")
    posted_by: dict[tuple, dict[int, Timed]] = defaultdict(dict)
    for lane, timed_acts in timeline.items():
        for timed in timed_acts:
            if timed.act.kind != "wait":  # a wait's keys are its launch's
                for key in timed.keys:
                    posted_by[key][lane] = timed
    return Replay(timeline, _windows(timeline, profiled), dict(posts), transfer, dict(posted_by))


def _keys(programs: dict[int, list[Act]]) -> dict[int, list[tuple]]:
    """Per lane and act, the matches it takes part in: the n-th P2P message between two lanes,
    the n-th collective of a member set on the rank (both numbered in program order, as gloo
    pairs them; the jobs issue a group's collectives from one thread of each rank)."""
    counters: dict[int, dict] = {}
    out = {}
    for lane in sorted(programs, key=lambda lane: (rank_of(lane), lane)):
        mine = counters.setdefault(rank_of(lane), {})
        out[lane] = _match_keys(lane, programs[lane], mine)
    return out


def _match_keys(lane: int, acts: list[Act], counters: dict) -> list[tuple]:
    sent: dict[int, int] = defaultdict(int)
    received: dict[int, int] = defaultdict(int)
    collectives: dict[tuple[int, ...], int] = counters.setdefault("coll", defaultdict(int))
    out = []
    for act in acts:
        mine: list[tuple] = []
        for peer in act.sends:
            mine.append(("p2p", lane, peer, sent[peer]))
            sent[peer] += 1
        for peer in act.recvs:
            mine.append(("p2p", peer, lane, received[peer]))
            received[peer] += 1
        if act.kind == "collective":  # numbered per rank: a rank's threads share the count
            mine.append(("coll", act.members, collectives[act.members]))
            collectives[act.members] += 1
        out.append(tuple(mine))
    return out


def _completion(key: tuple, posts: dict, transfer: dict, programs: dict, done: dict
                ) -> float | None:
    """When a match completes (None while a party has not posted)."""
    if key in done:
        return done[key]
    posted = posts.get(key, {})
    if key[0] == "p2p":
        missing = any(lane not in posted for lane in key[1:3] if lane in programs)
    else:
        ranks = {rank_of(lane) for lane in posted}
        missing = any(m not in ranks for m in key[1] if m in {rank_of(p) for p in programs})
    if missing:
        return None
    done[key] = max(posts[key].values()) + transfer.get(key, 0.0)
    return done[key]


def _windows(timeline: dict[int, list[Timed]], profiled: list[int]
             ) -> dict[int, tuple[float, float]]:
    """Rank -> (start, end) of what its profile holds: from entering its first profiled step
    to entering the step after its last (on its main thread)."""
    out = {}
    for r, timed in timeline.items():
        if r >= SIDE:
            continue
        marks = {t.act.step: t.start for t in timed if t.act.kind == "step"}
        end = marks.get(profiled[-1] + 1, timed[-1].end if timed else 0.0)
        out[r] = (marks[profiled[0]], end)
    return out


# --- explaining a wait --------------------------------------------------------------------------
def explain(rp: Replay, rank: int, timed: Timed, absent: frozenset[int] = frozenset()
            ) -> list[Piece]:
    """The pieces of `rank`'s wait in `timed` (a blocking act), latest first; waiting on an
    `absent` rank (not in the bundle) ends the explanation there."""
    out: list[Piece] = []
    _waited(rp, rank, timed, timed.start, timed.end, out, Piece("", rank, 0, 0, path=(rank,)),
            absent)
    return sorted(out, key=lambda p: -p.start)


def _waited(rp: Replay, lane: int, timed: Timed, a: float, b: float, out: list[Piece],
            trail: Piece, absent: frozenset[int]) -> None:
    """Explain [a, b] of a lane's blocking act: until the party posting last arrived, what that
    party did; then the transfer. `trail`: the path and comm categories that led here."""
    if b <= a or len(trail.path) > 200:
        return
    last, last_post = _last_party(rp, lane, timed)
    via = tuple(dict.fromkeys((*trail.via, timed.act.category) if timed.act.category
                              else trail.via))
    path = trail.path if rank_of(last) == trail.path[-1] else (*trail.path, rank_of(last))
    hop = Piece("", rank_of(last), 0, 0, path=path, via=via)
    if last_post > a and rank_of(last) in absent:
        out.append(Piece(ABSENT, rank_of(last), a, min(b, last_post),
                         category=timed.act.category, path=path, via=via))
    elif last_post > a:
        _ran(rp, last, a, min(b, last_post), out, hop, absent)
    if b > max(a, last_post):
        out.append(Piece(TRANSFER, rank_of(lane), max(a, last_post), b,
                         category=timed.act.category, path=trail.path, via=via))


def _last_party(rp: Replay, lane: int, timed: Timed) -> tuple[int, float]:
    """The party of a blocking act posting last, and when. Halves of a batched P2P call whose
    peers post within MIN_WAIT_MS of each other in the replay tie (the schedule does not say
    which came last): the recording decides, where it shows every tied post."""
    last, last_post, last_key = lane, timed.start, None
    for key in timed.keys:
        for other, t in rp.posts[key].items():
            if other != lane and t > last_post:
                last, last_post, last_key = other, t, key
    if last_key is None or last_key[0] != "p2p" or rp.recorded is None:
        return last, last_post
    tied = [(other, key) for key in timed.keys if key[0] == "p2p"
            for other, t in rp.posts[key].items()
            if other not in (lane, last) and t >= last_post - MIN_WAIT_MS]
    if not tied:
        return last, last_post
    candidates = [(last, last_key), *tied]
    seen = [rp.recorded(other, rp.posted_by[key][other], key) for other, key in candidates]
    if None in seen:
        return last, last_post
    return candidates[seen.index(max(seen))][0], last_post


def _ran(rp: Replay, lane: int, a: float, b: float, out: list[Piece], trail: Piece,
         absent: frozenset[int]) -> None:
    """Explain [a, b] by what `lane` did then."""
    rank, path, via = rank_of(lane), trail.path, trail.via
    first = rp.window[rank][0]
    if a < first:
        out.append(Piece(UNRECORDED, rank, a, min(b, first), path=path, via=via))
        a = min(b, first)
    for timed in rp.timeline[lane]:
        lo, hi = max(a, timed.start), min(b, timed.end)
        if hi <= lo:
            continue
        act = timed.act
        if act.kind == "sleep":
            out.append(Piece(INJECTED, rank, lo, hi, injection=act.injection, path=path,
                             via=via))
        elif act.kind == "compute":
            out.append(Piece(COMPUTE, rank, lo, hi, path=path, via=via))
        elif act.kind in BLOCKING:
            _waited(rp, lane, timed, lo, hi, out, trail, absent)


# --- the waits ground_truth.json states ---------------------------------------------------------
GroupName = Callable[[str, tuple[int, ...]], "str | None"]
"""A group's name (torch's pg_name) from its desc and members."""


def stated_waits(rp: Replay, profiled: list[int], injections: list[dict], idle: str,
                 absent: set[int] = frozenset(), group_name: GroupName | None = None
                 ) -> list[dict]:
    """Every wait of a profiled step longer than MIN_WAIT_MS in the replay, and every injected
    host stall, with what explains it. `injections`: ground_truth.json's; `idle`: the category of
    waiting on a peer's work (pipeline_fill with a pipeline, peer_compute without); `absent`:
    ranks not in the bundle (a wait on one is the comm's, with the rank to profile);
    `group_name`: names the group of each communication (None: no `group` stated)."""
    out = []
    for rank, timeline in sorted(rp.timeline.items()):
        if rank >= SIDE:  # bubbles are measured on main threads
            continue
        for timed in timeline:
            act = timed.act
            if act.step not in profiled or timed.end - timed.start < MIN_WAIT_MS:
                continue
            if act.kind in BLOCKING:
                pieces = explain(rp, rank, timed, frozenset(absent))
            elif act.kind == "sleep" and injections[act.injection]["annotation"] is None:
                pieces = [Piece(INJECTED, rank, timed.start, timed.end, act.injection,
                                path=(rank,))]
            else:
                continue
            wait = _stated(rank, timed, pieces, injections, idle)
            if group_name is not None:
                wait["group"] = group_name(act.group, act.members) if act.group else None
            out.append({**wait, **_halves(rp, rank, timed)})
    return out


def _halves(rp: Replay, lane: int, timed: Timed) -> dict:
    """A P2P call of several halves (a batch_isend_irecv): each half's peer, when it was released
    (ms after the call was posted) and by which of the peer's calls; `bound`: the half released
    last, which held the call (None when another half was released within MIN_WAIT_MS of it)."""
    p2p = [key for key in timed.keys if key[0] == "p2p"]
    if len(p2p) < 2:
        return {}
    halves = []
    for key in p2p:
        send = key[1] == lane
        peer = key[2] if send else key[1]
        by = rp.posted_by[key][peer].act
        halves.append({"half": "send" if send else "recv", "peer": rank_of(peer),
                       "released_ms": round(rp.released(key) - timed.start, 1),
                       "by": {"step": by.step, "where": list(by.where)}})
    last, *others = sorted(halves, key=lambda h: -h["released_ms"])
    alone = last["released_ms"] - others[0]["released_ms"] >= MIN_WAIT_MS
    return {"halves": halves,
            "bound": {"half": last["half"], "peer": last["peer"]} if alone else None}


def stragglers(programs: dict[int, list[Act]], profiled: list[int]) -> list[dict]:
    """Per profiled step, the ranks whose declared work and injected sleeps in an outermost
    annotation (FWD, BWD, ...) are at least STRAGGLER_RATIO times their peers' median there,
    where the peers declare work of their own in it (without, "usual" is not known)."""
    declared: dict[tuple[int, str], dict[int, float]] = defaultdict(dict)
    for lane, acts in programs.items():
        if lane >= SIDE:
            continue
        for act in acts:
            if act.kind in ("compute", "sleep") and act.where and act.step in profiled:
                block = declared[act.step, act.where[0]]
                block[lane] = block.get(lane, 0.0) + act.ms
    out = []
    for (step, block), ms in sorted(declared.items()):
        for rank, mine in sorted(ms.items()):
            peers = [ms.get(r, 0.0) for r in programs if r < SIDE and r != rank]
            usual = median(peers) if peers else 0.0
            if usual > 0 and mine >= STRAGGLER_RATIO * usual:
                out.append({"step": step, "rank": rank, "annotation": block, "ms": round(mine, 1),
                            "peers_median_ms": round(usual, 1),
                            "ratio": round(mine / usual, 2)})
    return out


def _stated(rank: int, timed: Timed, pieces: list[Piece], injections: list[dict], idle: str
            ) -> dict:
    def category(p: Piece) -> str:
        return {INJECTED: injections[p.injection]["root_category"] if p.injection >= 0 else "",
                COMPUTE: idle, TRANSFER: p.category, ABSENT: p.category,
                UNRECORDED: "unknown"}[p.cause]

    totals: dict[tuple[str, int, str], float] = defaultdict(float)
    grouped: dict[tuple[str, int, str], list[Piece]] = defaultdict(list)
    for p in pieces:
        totals[p.cause, p.rank, category(p)] += p.ms
        grouped[p.cause, p.rank, category(p)].append(p)
    keys = list(grouped)  # the causes, by origin; the root is tracegraph's rule, not its output
    root = keys[root_of([(totals[k], min(p.start for p in grouped[k])) for k in keys],
                        timed.end - timed.start)]
    dominant = root[2]
    origin = max(grouped[root], key=lambda p: p.ms)
    act = timed.act
    return {
        "rank": rank, "step": act.step, "where": list(act.where),
        "op": "idle" if act.kind == "sleep" else act.comm or act.kind,
        "ms": round(timed.end - timed.start, 1),
        "category": dominant,
        "root_rank": origin.rank if origin.cause != TRANSFER else None,
        "chain": list(origin.path),
        "via": sorted({c for p in pieces for c in p.via}),
        "causes": [{"cause": cause, "rank": r, "category": cat, "ms": round(ms, 1)}
                   for (cause, r, cat), ms in sorted(totals.items(), key=lambda kv: -kv[1])],
    }
