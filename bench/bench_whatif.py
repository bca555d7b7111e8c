"""What-if benchmark: replay and prediction time against the analysis time, in the same process.

Writes the `large` scenario (PP4 × VPP2 replicas, async HSDP) at 8 and 128 ranks (bench_scale's
`simulate`), then in a fresh process per input: load (not compared), `analyze`, the timing model
(`Subject`: edges, constants, inferred edges), the replay of the unmodified model, and a
prediction (`--fix couple-reduction`: every HSDP reduction put back before its send, a full
re-timing). Prints each time and its ratio to the analysis: replay must stay a small fraction of
it, a million ops in seconds.

    .venv/bin/python bench/bench_whatif.py --ranks 8 128 --kernels 2000 100
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench_load import measure
from bench_scale import simulate

TIMED = """
import time, tracegraph
from tracegraph.analysis.analyze import analyze
from tracegraph.whatif.predict import predict
from tracegraph.whatif.reduction import CoupleReduction
from tracegraph.whatif.subject import Subject
trace = tracegraph.load({bundle!r}, use_cache=False)
t0 = time.perf_counter(); analysis = analyze(trace)
t1 = time.perf_counter(); subject = Subject(analysis)
t2 = time.perf_counter(); base = subject.baseline
t3 = time.perf_counter(); prediction = predict(subject, [CoupleReduction()])
t4 = time.perf_counter()
error = prediction.errors["error"].max()
print(len(analysis.ops), t1 - t0, t2 - t1, t3 - t2, t4 - t3, error)
"""


def run(folder: Path, ranks: int, kernels: int, fmt: str) -> str:
    bundle = folder / f"large-{fmt}-{ranks}r-{kernels}k.tar.gz"
    simulate(bundle, ranks, kernels, fmt)
    step = measure(TIMED.format(bundle=str(bundle)))
    ops, analyze_s, model_s, replay_s, predict_s, error = step.out.split()[-6:]
    analyze_s = float(analyze_s)
    ratios = " ".join(f"{float(s):>7.2f} s {float(s) / analyze_s:>6.3f}×"
                      for s in (model_s, replay_s, predict_s))
    return (f"{fmt:>7} {ranks:>6} {int(ops):>10,} {analyze_s:>8.2f} s {ratios} "
            f"{100 * float(error):>8.4f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--kernels", type=int, nargs="+", default=[2000, 100],
                        help="kernels per F/B chunk, one per --ranks value")
    parser.add_argument("--format", nargs="+", choices=["ascend", "kineto"], default=["ascend"])
    parser.add_argument("--keep", type=Path, help="keep (and reuse) the bundles in this folder")
    args = parser.parse_args()
    if len(args.kernels) != len(args.ranks):
        parser.error("--kernels takes one value per --ranks value")
    print(f"{'format':>7} {'ranks':>6} {'ops':>10} {'analyze':>10} {'model':>10} {'÷ analyze':>8}"
          f" {'replay':>9} {'÷ analyze':>8} {'predict':>9} {'÷ analyze':>8} {'replay err':>10}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="tracegraph-whatif-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for fmt in args.format:
            for ranks, kernels in zip(args.ranks, args.kernels, strict=True):
                print(run(folder, ranks, kernels, fmt), flush=True)


if __name__ == "__main__":
    main()
