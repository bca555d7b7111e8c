"""The corpus of real PyTorch-profiler recordings with injected causes (tests/data/corpus).

Each case folder holds `rankN.json.gz` (torch 2.13.0 CPU, gloo, 127.0.0.1; recorded by
bench/record_corpus.py) and `ground_truth.json`, written by the recorder from what it injected;
tests/data/corpus/README.md documents the format.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "data" / "corpus"
CASES: tuple[str, ...] = tuple(sorted(p.name for p in CORPUS.iterdir()
                                      if (p / "ground_truth.json").is_file()))
"""The case folders' names."""


def folder(case: str) -> Path:
    """The folder of `case` (what `tracegraph.load` / `tracegraph analyze` take)."""
    return CORPUS / case


@cache
def _truth(case: str) -> str:
    return (CORPUS / case / "ground_truth.json").read_text()


def truth(case: str) -> dict:
    """The ground_truth.json of `case` (a fresh copy on every call)."""
    return json.loads(_truth(case))


def raw(case: str, rank: int) -> dict:
    """The Chrome-trace JSON of one rank of `case`, as the profiler exported it."""
    return json.loads(gzip.decompress((CORPUS / case / f"rank{rank}.json.gz").read_bytes()))
