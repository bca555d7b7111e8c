"""Exposed communication: the part of each group kind's communication during which the rank's
main lane was not computing, per rank and stage; of that, the transfers' own (the ops' time
after their binding dependency let them go: what the critical path and the replay credit to
transfers), what the profile cannot explain, and the rest, the ops waiting for their peers (a
peer's half not posted, a member not arrived: late work elsewhere, which no overlap hides); and
each stage reduction's overlap with the later compute (the seed's acceptance: "the first long
AllReduce overlaps later VPP chunk compute")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph.analysis.findings.finding import INFO, WARNING, Finding
from tracegraph.analysis.overlap import overlap_table, reduction_overlap

NAMES = {"ep": "EP all-to-all", "dp": "DP/HSDP reduction", "pp": "PP P2P", "tp": "TP",
         "cp": "CP"}
EXPOSED_SHARE = 0.5  # a kind mostly exposed ...
STEP_SHARE = 0.05  # ... for at least this share of the step is a warning
ELSEWHERE = ("for the peer's half or the group's last member (late work elsewhere, which "
             "overlap cannot hide)")
UNEXPLAINED = "while the device idled for a reason the profile does not hold (no stream wait)"
RECORD_WAITS = ("profile with the device's stream waits (Ascend trace_view.json, Kineto with "
                "CUDA / HIP events) to tell which")
SUGGESTIONS = {
    "ep": "overlap the all-to-all with the other microbatch's compute (combined 1F1B / "
          "--overlap-moe-expert-parallel-comm with --delay-wgrad-compute), on its own stream",
    "dp": "launch the stage reduction asynchronously on its own stream and wait for it only "
          "before the optimizer (overlap_grad_reduce)",
    "pp": "post P2P asynchronously and overlap it with the stage's compute (overlap_p2p_comm)",
}


def exposed_table(analysis, stages: dict[int, int]) -> pd.DataFrame:
    """rank, stage, dim, comm_ms, exposed_ms, waiting_ms, unexplained_ms, own_ms: per step
    (mean over the rank's steps), the communication in flight, the part not hidden by compute,
    of that the part blame could not explain (no wait in the profile to follow), the
    transfers' own (overlap_table's transfer_ms), and the rest: the ops waiting for their
    peers."""
    columns = ["rank", "stage", "dim", "comm_ms", "exposed_ms", "waiting_ms", "unexplained_ms",
               "own_ms"]
    table = overlap_table(analysis)
    if not len(table):
        return pd.DataFrame(columns=columns)
    table = table.assign(exposed_ms=table["comm_ms"] - table["overlap_ms"])
    steps = table.groupby("rank")["step"].nunique()
    sums = table.groupby(["rank", "dim"], as_index=False)[
        ["comm_ms", "exposed_ms", "transfer_ms", "unexplained_ms"]].sum()
    per = sums["rank"].map(steps)
    exposed = sums["exposed_ms"] / per
    unexplained = np.minimum(sums["unexplained_ms"] / per, exposed)  # lanes' bubbles overlap
    own = np.minimum(sums["transfer_ms"] / per, exposed - unexplained)
    return sums.assign(stage=sums["rank"].map(stages).fillna(0).astype(int),
                       comm_ms=sums["comm_ms"] / per, exposed_ms=exposed,
                       unexplained_ms=unexplained, own_ms=own,
                       waiting_ms=exposed - own - unexplained)[columns]


def finding(analysis, stages: dict[int, int]) -> Finding | None:
    """The exposed-communication finding; None without communication inside the steps."""
    table = exposed_table(analysis, stages)
    if not len(table):
        return None
    step_ms = analysis.step_table().groupby("rank")["ms"].mean()  # each rank's own step
    lines, evidence, worst = [], {"per_rank": [], "by_dim": {}}, None
    for dim, rows in table.groupby("dim"):
        comm, exposed = rows["comm_ms"].sum(), rows["exposed_ms"].sum()
        waiting, unexplained = rows["waiting_ms"].sum(), rows["unexplained_ms"].sum()
        own = rows["own_ms"].sum()
        top = rows.loc[rows["own_ms"].idxmax()]
        stage_rows = rows.groupby("stage")[["comm_ms", "exposed_ms"]].mean()
        evidence["by_dim"][dim] = {
            "comm_ms": round(comm, 3), "exposed_ms": round(exposed, 3),
            "waiting_ms": round(waiting, 3), "unexplained_ms": round(unexplained, 3),
            "hidden_share": round(1 - exposed / comm, 4) if comm else None,
            "worst_rank": int(top["rank"]), "worst_exposed_ms": round(top["own_ms"], 3),
            "by_stage": {str(s): {k: round(v, 3) for k, v in r.items()}
                         for s, r in stage_rows.iterrows()}}
        if round(comm, 1):  # a dim that rounds to 0.0 ms is left to the evidence
            stage_text = "; per rank by stage (exposed/total ms): " + ", ".join(
                f"stage {s} {r['exposed_ms']:.1f}/{r['comm_ms']:.1f}"
                for s, r in stage_rows.iterrows()) if len(stage_rows) > 1 else ""
            lines.append(f"{NAMES.get(dim, dim)}: {exposed:.1f} of {comm:.1f} ms exposed per "
                         f"step (summed over ranks, {1 - exposed / comm:.0%} hidden), of that "
                         f"the transfers' own {own:.1f} ms (most on rank {int(top['rank'])}: "
                         f"{top['own_ms']:.1f} ms){_not_own(waiting, unexplained)}{stage_text}")
        mostly = own / comm > EXPOSED_SHARE if comm else False
        if mostly and top["own_ms"] > STEP_SHARE * step_ms[top["rank"]] and (
                worst is None or top["own_ms"] > worst[1]):
            worst = (dim, float(top["own_ms"]), int(top["rank"]))
    evidence["per_rank"] = [{k: (round(v, 3) if isinstance(v, float) else v)
                             for k, v in row.items()} for row in table.to_dict("records")]
    reductions = reduction_overlap(analysis)
    if len(reductions):
        lines.append(_reduction_line(analysis, reductions))
        evidence["stage_reductions"] = [
            {"rank": int(r.rank), "start_ms": round((r.start - analysis.origin) / 1e6, 3),
             "ms": round(r.ms, 3), "overlap_ratio": round(float(r.ratio), 4)}
            for r in reductions.itertuples()]
    if worst is None:
        return Finding("exposed_comm", INFO, *_quiet(table), lines, evidence)
    dim, ms, rank = worst
    return Finding("exposed_comm", WARNING,
                   f"{NAMES.get(dim, dim)} exposed: up to {ms:.1f} ms per step on rank {rank} "
                   f"({ms / step_ms[rank]:.0%} of its step)",
                   SUGGESTIONS.get(dim, "overlap it with compute"), lines, evidence)


def _not_own(waiting: float, unexplained: float) -> str:
    """What of a kind's exposed time is not the transfers' own, as a clause."""
    parts = [f"{ms:.1f} ms {text}" for ms, text in (
        (waiting, f"waiting {ELSEWHERE}"), (unexplained, UNEXPLAINED)) if ms >= 0.05]
    return "".join(f", {part}" for part in parts)


def _quiet(table: pd.DataFrame) -> tuple[str, str]:
    """Title and suggestion when no kind's own exposure warrants a warning."""
    waiting, unexplained, own = (table[c].sum() for c in ("waiting_ms", "unexplained_ms",
                                                             "own_ms"))
    if unexplained > max(waiting, own):
        return (f"communication exposed {unexplained:.1f} ms per step (summed over ranks) "
                f"{UNEXPLAINED}: the transfers or a late peer", RECORD_WAITS)
    if waiting > own:
        return ("communication exposed mostly while waiting for work elsewhere, not for the "
                "transfers", "follow the bubbles' chains to the late work")
    return "communication mostly hidden behind compute", "nothing to do"


def _reduction_line(analysis, reductions: pd.DataFrame) -> str:
    ratio = reductions["overlap_ms"].sum() / reductions["ms"].sum()
    longest = reductions.loc[reductions["ms"].idxmax()]
    return (f"stage reductions: {len(reductions)}, {ratio:.0%} of their time overlapped by "
            f"compute; longest on rank {int(longest['rank'])} at "
            f"{(longest['start'] - analysis.origin) / 1e6:.1f} ms: {longest['ms']:.1f} ms, "
            f"{longest['ratio']:.0%} overlapped")
