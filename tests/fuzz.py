"""A fuzzer over real profiles: damaged and hostile mutants of ../shared/real_traces and of the
samples, run through the command line in this process, each checked for what every input must
keep, however broken:

* the exit code is 0, 1 or 2, and nothing escapes as an exception (no traceback);
* it ends within CASE_SECONDS (an alarm interrupts a hang) and the process stays under
  MEMORY_BYTES;
* the input is left as it was: no file changed, none added beside it;
* an input a mutation damaged in a way the tool can tell ends in a warning or an error; an
  error is one line naming the bundle or one of its files.

Hand-rolled rather than Hypothesis: the mutations are structural edits of multi-megabyte real
profiles, archives and folders, where shrinking gains little and costs much; a case is one
integer (`case(n)`), so a failure is rerun exactly with its number; and no dependency is added.
Real traces are read where they lie; mutants are written only under the given work folder.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import random
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
import traceback
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path

from typer.testing import CliRunner

from parsers.text import printable
from tests.conftest import REAL, SAMPLES
from tracegraph.cli.app import app

CASE_SECONDS = 120
"""A case still running after this long is a hang (a loaded 2-core CI machine included)."""
MEMORY_BYTES = 3 << 30
"""The process's peak RSS must stay under this, whatever the cases before it did."""
MIB = 1 << 20


# --- seeds: real profiles, read where they lie ---------------------------------------------------
@dataclass(frozen=True)
class Seed:
    """A real bundle to mutate: files under `root` (or members of the tar `root`)."""

    name: str
    format: str  # kineto | ascend
    root: Path
    rename: tuple[tuple[str, str], ...] = ()  # (file, name in the mutant)

    def files(self) -> dict[str, bytes]:
        return dict(_seed_files(self))


@cache
def _seed_files(seed: Seed) -> tuple[tuple[str, bytes], ...]:
    names = dict(seed.rename)
    if seed.root.is_file():  # a sample archive: its members
        with tarfile.open(seed.root) as tar:
            found = [(m.name.split("/", 1)[1], tar.extractfile(m).read())
                     for m in tar.getmembers() if m.isfile()]
    else:
        found = [(p.relative_to(seed.root).as_posix(), p.read_bytes())
                 for p in sorted(seed.root.rglob("*")) if p.is_file()]
    return tuple((names.get(name, name), data) for name, data in found)


HTA = REAL / "kineto" / "hta"
SEEDS = (
    Seed("gloo", "kineto", REAL / "kineto" / "gloo_pp2_dp2"),
    Seed("gloo-sample", "kineto", SAMPLES / "gloo_pp2_dp2"),
    Seed("cpu-only", "kineto", HTA / "cpu_only"),
    Seed("event-sync", "kineto", HTA / "critical_path" / "cuda_event_sync"),
    Seed("nccl", "kineto", HTA / "nccl_parser_config"),
    Seed("sim-kineto", "kineto", SAMPLES / "simulated" / "hsdp-straggler-sync-kineto.tar.gz"),
    Seed("ddp8", "ascend", REAL / "ascend" / "torch_npu_ddp8_level1"),
    Seed("pp2dp2", "ascend", REAL / "ascend" / "torch_npu_pp2dp2_level2_comm"),
    Seed("ascend-2023", "ascend", REAL / "ascend" / "torch_npu_2023_comm"),
    Seed("sim-ascend", "ascend", SAMPLES / "simulated" / "pp-compute-straggler-ascend.tar.gz"),
)
SEED_WEIGHTS = (6, 2, 4, 3, 1, 1, 3, 3, 2, 1)


# --- a mutant ------------------------------------------------------------------------------------
@dataclass
class Mutant:
    """A bundle being damaged: its files, how it is packed, and folder tricks to play on it."""

    seed: Seed
    files: dict[str, bytes]
    pack: str = "dir"  # dir | file | tar | tar.gz | zip
    tricks: list[Callable[[Path], None]] = field(default_factory=list)  # on the written folder
    archive_tricks: list[Callable[[Path], None]] = field(default_factory=list)  # on the archive
    what: list[str] = field(default_factory=list)
    damaged: bool = False  # the tool can tell: a warning or an error is due
    negated: set[str] = field(default_factory=set)  # files whose times were negated
    played: set[str] = field(default_factory=set)  # folder tricks played
    mutations: list[str] = field(default_factory=list)  # the names of those applied

    def note(self, what: str, damaged: bool) -> None:
        self.what.append(what)
        self.damaged |= damaged

    def traces(self) -> list[str]:
        """The files holding events: Kineto traces, Ascend trace_view.json."""
        if self.seed.format == "kineto":
            return sorted(n for n in self.files if n.endswith((".json", ".json.gz")))
        return sorted(n for n in self.files if n.endswith("trace_view.json"))

    def ranks(self) -> list[str]:
        """One file or folder per rank profile."""
        if self.seed.format == "kineto":
            return self.traces()
        return sorted({n.split("/")[0] for n in self.files if "profiler_info" in n})


def read_json(mutant: Mutant, name: str) -> object:
    data = mutant.files[name]
    return json.loads(gzip.decompress(data) if name.endswith(".gz") else data)


def write_json(mutant: Mutant, name: str, doc: object, text: str | None = None) -> None:
    data = (text if text is not None else json.dumps(doc)).encode()
    mutant.files[name] = gzip.compress(data, 1) if name.endswith(".gz") else data


def _a_trace(rng: random.Random, m: Mutant) -> tuple[str, object]:
    """One of the mutant's traces, chosen by `rng`, and its JSON document."""
    name = rng.choice(m.traces())
    return name, read_json(m, name)


def events_of(doc: object) -> list[dict]:
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return events if isinstance(events, list) else []


def complete(doc: object) -> list[dict]:
    return [e for e in events_of(doc) if isinstance(e, dict) and e.get("ph") == "X"]


# --- mutations -----------------------------------------------------------------------------------
# Each takes (rng, mutant), edits the mutant and notes what it did and whether the tool can
# tell; it returns False when it does not apply to this mutant (another one is drawn).
BAD_NUMBERS = (2**63, 2**64, -(2**63) - 1, 1e308, -1e308, "1" * 30, "nan", "inf", "-inf",
               "abc", "")
BAD_TIMES = (*BAD_NUMBERS, None, -1, -5000.5, -1e-9, "1.2.3")  # -1e-9 µs: negative, as 0 ns


def bad_event_field(rng: random.Random, m: Mutant) -> bool:
    """ts / dur / ids of a few complete events set to out-of-range or unreadable values."""
    name, doc = _a_trace(rng, m)
    events = complete(doc)
    if not events:
        return False
    kineto = m.seed.format == "kineto"
    fields = ["ts", "dur", "args.correlation" if kineto else "args.connection_id"]
    fields += ["tid"] if kineto else []
    key = rng.choice(fields)
    values = BAD_TIMES if key in ("ts", "dur") else BAD_NUMBERS
    value = rng.choice(values)
    if key == "dur" and value == "":
        value = None
    hit = rng.sample(events, min(len(events), rng.choice((1, 3, 50))))
    for event in hit:
        _set(event, key, value)
    write_json(m, name, doc)
    told = key in ("ts", "dur") or value != ""
    if kineto and key in ("ts", "dur"):  # an event of another category is not read at all
        told = any(e.get("cat") in _KINETO_CATS for e in hit)
    if key == "args.connection_id":  # device rows carry it; a host row's is not read
        told = value != "" and any(isinstance(e.get("args"), dict) and "Task Type" in e["args"]
                                   for e in hit)
    if key == "args.correlation":  # read only where the event has one to lose
        told = value != "" and any(e.get("cat") in _KINETO_CATS for e in hit)
    if key == "tid":  # a cuda_sync with a `stream` arg reads that, not its tid
        told = value != "" and any(e.get("cat") in _KINETO_CATS and not (
            e.get("cat") == "cuda_sync" and "stream" in (e.get("args") or {})) for e in hit)
    m.note(f"{name}: {key} of {len(hit)} events = {value!r:.40}", told)
    return True


_KINETO_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "kernel",
                "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation", "Kernel",
                "Runtime", "Memcpy", "Memset"}


def _set(event: dict, key: str, value: object) -> None:
    if key.startswith("args."):
        event.setdefault("args", {})
        if isinstance(event["args"], dict):
            event["args"][key[5:]] = value
    else:
        event[key] = value


def negate_times(rng: random.Random, m: Mutant) -> bool:
    """Every timestamp of one trace negated (and every duration, sometimes)."""
    name, doc = _a_trace(rng, m)
    events = complete(doc)
    if not events or name in m.negated:  # twice would give the file back
        return False
    m.negated.add(name)
    durations = rng.random() < 0.3
    for event in events_of(doc):
        if isinstance(event, dict) and isinstance(event.get("ts"), int | float):
            event["ts"] = -event["ts"]
        elif isinstance(event, dict) and isinstance(event.get("ts"), str):
            event["ts"] = "-" + event["ts"]
        if durations and isinstance(event, dict) and isinstance(event.get("dur"), int | float):
            event["dur"] = -event["dur"] - 1
    write_json(m, name, doc)
    m.note(f"{name}: timestamps negated" + (", durations too" if durations else ""), True)
    return True


def negative_durations(rng: random.Random, m: Mutant) -> bool:
    name, doc = _a_trace(rng, m)
    events = [e for e in complete(doc) if isinstance(e.get("dur"), int | float)]
    if not events:
        return False
    for event in rng.sample(events, min(len(events), rng.choice((1, 10)))):
        event["dur"] = -event["dur"] - 0.5
    write_json(m, name, doc)
    m.note(f"{name}: negative durations", True)
    return True


def strip_field(rng: random.Random, m: Mutant) -> bool:
    """A field removed from every event: name, ph, ts, dur, cat (told), args, pid, tid."""
    name, doc = _a_trace(rng, m)
    if not complete(doc):
        return False
    key = rng.choice(("name", "ph", "ts", "dur", "cat", "args", "pid", "tid"))
    for event in events_of(doc):
        if isinstance(event, dict):
            event.pop(key, None)
    write_json(m, name, doc)
    told = key in ("name", "ph", "ts", "dur") or (key == "cat" and m.seed.format == "kineto")
    m.note(f"{name}: {key!r} removed from every event", told)
    return True


def degenerate_events(rng: random.Random, m: Mutant) -> bool:
    """traceEvents emptied, only metadata, not a list, or the whole document not an object."""
    name, doc = _a_trace(rng, m)
    how = rng.choice(("empty", "metadata", "not a list", "null", "array of numbers"))
    events = [e for e in events_of(doc) if isinstance(e, dict) and e.get("ph") == "M"]
    replacement = {"empty": [], "metadata": events, "not a list": {"a": 1}, "null": None,
                   "array of numbers": [1, 2, 3]}[how]
    if isinstance(doc, dict):
        doc["traceEvents"] = replacement
    else:
        doc = replacement
    write_json(m, name, doc)
    m.note(f"{name}: traceEvents {how}", True)
    return True


def deep_nesting(rng: random.Random, m: Mutant) -> bool:
    """A 10,000- to 100,000-deep array in an event's args, distributedInfo or a side file."""
    depth = rng.choice((10_000, 100_000))
    deep = "[" * depth + "]" * depth
    name = rng.choice(m.traces() + [n for n in m.files if n.endswith("profiler_info_0.json")])
    text = (gzip.decompress(m.files[name]) if name.endswith(".gz") else m.files[name]).decode()
    where = rng.choice(('"args": {', '"distributedInfo": {', "{"))
    at = text.find(where)
    if at < 0:
        return False
    at += len(where)
    text = text[:at] + f'"deep": {deep}' + ("," if text[at:].lstrip()[:1] != "}" else "") + \
        text[at:]
    write_json(m, name, None, text)
    m.note(f"{name}: {depth:,}-deep array after {where!r}", False)
    return True


def long_names(rng: random.Random, m: Mutant) -> bool:
    """One 16 MiB name (an annotation's or a thread's), or 100 KB names on every event."""
    name, doc = _a_trace(rng, m)
    events = complete(doc)
    if not events or len(events) > 3000:  # 100 KB each: a few hundred MB is enough
        return False
    if rng.random() < 0.5:
        kept = [e for e in events if m.seed.format != "kineto" or e.get("cat") in _KINETO_CATS]
        if not kept:
            return False
        target = max(kept, key=lambda e: e.get("dur") if isinstance(e.get("dur"), float | int)
                     else 0)
        target["name"] = "N" * (16 * MIB)
        m.note(f"{name}: a 16 MiB name on its longest event", True)
    else:
        for event in events:
            event["name"] = str(event.get("name", "")) + "x" * 100_000
        m.note(f"{name}: 100 KB names on every event", True)
    write_json(m, name, doc)
    return True


ODD_TEXT = ("[/x]", "[bold red]x[/]", "[link=file:///etc/passwd]y[/link]", "\x1b[31mred\x1b[0m",
            "a\nb\rc", "\u202eevil", "nul\x00byte", "[dask]", "\\", "%s%n", "\ud7ff\ue000")


def odd_names(rng: random.Random, m: Mutant) -> bool:
    """Markup, escape sequences, line breaks and odd code points in names."""
    name, doc = _a_trace(rng, m)
    events = [e for e in events_of(doc) if isinstance(e, dict)]
    if not events:
        return False
    text = rng.choice(ODD_TEXT)
    events = [e for e in events if not str(e.get("name", "")).startswith("ProfilerStep#")]
    for event in rng.sample(events, min(len(events), 200)):  # steps stay steps
        if event.get("ph") == "M" and isinstance(event.get("args"), dict):
            event["args"]["name"] = text
        else:
            event["name"] = text + str(event.get("name", ""))
    write_json(m, name, doc)
    m.note(f"{name}: names with {text!r}", False)
    return True


def step_number(rng: random.Random, m: Mutant) -> bool:
    name, doc = _a_trace(rng, m)
    steps = [e for e in complete(doc) if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        return False
    for event in steps:
        event["name"] = "ProfilerStep#" + "9" * rng.choice((10, 30))
    write_json(m, name, doc)
    m.note(f"{name}: ProfilerStep numbers beyond int32", True)
    return True


def distributed_info(rng: random.Random, m: Mutant) -> bool:
    """Kineto: rank, world size, clock base or pg_config out of range, disagreeing, unreadable."""
    names = [n for n in m.traces() if isinstance(read_json(m, n), dict)]
    if m.seed.format != "kineto" or not names:
        return False
    name = rng.choice(names)
    doc = read_json(m, name)
    info = doc.get("distributedInfo")
    key = rng.choice(("rank", "world_size", "baseTimeNanoseconds", "pg_config"))
    value = rng.choice((2**40, 2**64, -7, "abc", 1e308, "double"))
    if key == "baseTimeNanoseconds":  # 2^40 ns is a time (1970, 18 minutes in): 2^62 + 1 is not
        doc[key] = value if value not in (2**40, "double") else 2**62 + 1
    elif not isinstance(info, dict):
        return False
    elif key == "pg_config" and isinstance(info.get("pg_config"), list) and info["pg_config"]:
        pg = rng.choice(info["pg_config"])
        if not isinstance(pg, dict) or "pg_name" not in pg or value == "double":
            return False
        pg["ranks"] = [value, *(pg.get("ranks") or [])[1:]]
    elif key == "world_size":  # "double": a size that disagrees with the other ranks'
        info[key] = value if value != "double" else 2 * int(info.get("world_size") or 4)
    elif key == "rank" and value != "double":
        info[key] = value
    else:
        return False
    write_json(m, name, doc)
    m.note(f"{name}: {key} = {value!r:.30}", True)
    return True


def rank_set(rng: random.Random, m: Mutant) -> bool:
    """A rank dropped, emptied, copied or given another rank's id (multi-rank bundles)."""
    ranks = m.ranks()
    if len(ranks) < 2:
        return False
    victim = rng.choice(ranks)
    how = rng.choice(("drop", "empty", "copy", "conflict"))
    if how == "drop":  # every seed states its world size or its groups' members
        for name in [n for n in m.files if n == victim or n.startswith(victim + "/")]:
            del m.files[name]
        m.note(f"rank {victim} removed", True)
    elif how == "empty" and m.seed.format == "kineto":
        doc = read_json(m, victim)
        doc["traceEvents"] = [e for e in events_of(doc) if e.get("ph") == "M"]
        write_json(m, victim, doc)
        m.note(f"{victim}: no events", True)
    elif how == "copy" and m.seed.format == "kineto":
        stem, dot, rest = victim.partition(".")
        m.files[f"{stem}_copy.{rest}" if dot else victim + "_copy"] = m.files[victim]
        m.note(f"{victim} copied", True)
    elif how == "conflict" and m.seed.format == "kineto":
        other = rng.choice([r for r in ranks if r != victim])
        doc, theirs = read_json(m, victim), read_json(m, other)
        if not isinstance(doc.get("distributedInfo"), dict) or not isinstance(
                theirs.get("distributedInfo"), dict):
            return False
        doc["distributedInfo"]["rank"] = theirs["distributedInfo"].get("rank")
        write_json(m, victim, doc)
        m.note(f"{victim} states {other}'s rank", True)
    else:
        return False
    return True


def truncate(rng: random.Random, m: Mutant) -> bool:
    """A trace (or side file) cut short; a gzipped one sometimes only by its 8-byte trailer."""
    name = rng.choice(m.traces() + [n for n in m.files if n.endswith("communication.json")])
    if name.endswith(".gz") and rng.random() < 0.3:
        m.files[name] = m.files[name][:-rng.choice((4, 8))]
        m.note(f"{name}: gzip trailer cut", True)
        return True
    raw = gzip.decompress(m.files[name]) if name.endswith(".gz") else m.files[name]
    end = len(raw.rstrip())
    if end < 4:
        return False
    cut = rng.randrange(1, end - 1)
    write_json(m, name, None, raw[:cut].decode("utf-8", "ignore"))
    told = name in m.traces()
    m.note(f"{name}: cut at byte {cut:,} of {len(raw):,}", told)
    return True


def byte_damage(rng: random.Random, m: Mutant) -> bool:
    """Flipped bytes, garbage, an empty file, invalid UTF-8 or UTF-16 in a trace or side file."""
    name = rng.choice(list(m.files))
    raw = bytearray(gzip.decompress(m.files[name]) if name.endswith(".gz") else m.files[name])
    how = rng.choice(("flip", "garbage", "empty", "bad utf-8", "utf-16", "nul"))
    if how == "flip" and raw:
        for _ in range(rng.choice((1, 8))):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    elif how == "garbage":
        raw = bytearray(rng.randbytes(rng.choice((1, 1000, 100_000))))
    elif how == "empty":
        raw = bytearray()
    elif how == "bad utf-8" and b'"name": "' in raw:
        at = raw.find(b'"name": "') + 9
        raw[at:at] = b"\xff\xfe\xc0"
    elif how == "utf-16":
        raw = bytearray(bytes(raw).decode("utf-8", "replace").encode("utf-16"))
    elif how == "nul" and raw:
        at = rng.randrange(len(raw))
        raw[at:at] = b"\x00" * 64
    else:
        return False
    data = bytes(raw)
    m.files[name] = gzip.compress(data, 1) if name.endswith(".gz") else data
    trace = name in m.traces()
    told = trace and how in ("garbage", "empty", "bad utf-8", "utf-16", "nul")
    m.note(f"{name}: {how}", told)
    return True


def side_files(rng: random.Random, m: Mutant) -> bool:
    """Ascend side files: ranks, groups, op times and CSV fields out of range or unreadable."""
    if m.seed.format != "ascend":
        return False
    how = rng.choice(("group ranks", "op start", "op elapse", "csv field", "csv bare cr",
                      "metadata world size", "huge group rank", "world sizes disagree",
                      "comm prefix"))
    comm_only = not m.traces()
    if how in ("huge group rank", "world sizes disagree", "comm prefix"):
        return _side_damage(rng, m, how)
    if how == "group ranks":
        name = _pick(rng, m, "profiler_metadata.json")
        doc = read_json(m, name) if name else None
        groups = doc.get("parallel_group_info") if isinstance(doc, dict) else None
        if not groups:
            return False
        entry = rng.choice(list(groups.values()))
        entry["global_ranks"] = [2**40, *entry.get("global_ranks", [])]
        write_json(m, name, doc)
        m.note(f"{name}: a global rank of 2^40", True)
    elif how in ("op start", "op elapse"):
        name = _pick(rng, m, "communication.json")
        if not name:
            return False
        key = "Start Timestamp(us)" if how == "op start" else "Elapse Time(ms)"
        value = rng.choice(("abc", "1" * 30, -5)) if how == "op start" else rng.choice(
            (1e308, -3.0))
        text = m.files[name].decode()
        count = text.count(f'"{key}"')
        if not count:
            return False
        text = _replace_values(text, key, json.dumps(value))
        write_json(m, name, None, text)
        m.note(f"{name}: every {key} = {value!r:.20}", comm_only)
    elif how in ("csv field", "csv bare cr"):
        name = _pick(rng, m, "step_trace_time.csv")
        if not name:
            return False
        if how == "csv field":
            m.files[name] = b"Device_id,Step\n0,\"" + b"x" * 200_000 + b"\"\n"
        else:
            m.files[name] = b"Device_id,Step\r0,1\r"
        m.note(f"{name}: {how}", how == "csv field")
    else:
        name = _pick(rng, m, "profiler_metadata.json")
        doc = read_json(m, name) if name else None
        if not isinstance(doc, dict):
            return False
        value = rng.choice((2**40, 0, -1))
        doc.setdefault("distributed_args", {})["world_size"] = value
        write_json(m, name, doc)
        m.note(f"{name}: world_size {value}", value != -1)  # -1: msprof's "not stated"
    return True


def _side_damage(rng: random.Random, m: Mutant, how: str) -> bool:
    """A group member beyond int64 (a 2-member group's, where P2P peers come from); one rank
    stating another world size than the rest; bytes before communication.json's JSON."""
    if how == "comm prefix":
        name = _pick(rng, m, "communication.json")
        if not name:
            return False
        m.files[name] = rng.choice((b"garbage", b"\xef\xbb\xbf", b"\x00\x01")) + m.files[name]
        m.note(f"{name}: bytes before its JSON", True)
        return True
    names = sorted(n for n in m.files if n.endswith("profiler_metadata.json"))
    docs = {n: d for n in names if isinstance(d := read_json(m, n), dict)}
    if not docs:
        return False
    name = rng.choice(sorted(docs))
    doc = docs[name]
    if how == "world sizes disagree":
        stated = (doc.get("distributed_args") or {}).get("world_size")
        doc.setdefault("distributed_args", {})["world_size"] = 2 * (
            stated if isinstance(stated, int) and stated > 0 else len(m.ranks()) or 1)
    else:
        groups = [g for g in (doc.get("parallel_group_info") or {}).values()
                  if isinstance(g, dict) and g.get("global_ranks")]
        if not groups:
            return False
        pair = [g for g in groups if len(g["global_ranks"]) == 2]
        entry = rng.choice(pair or groups)
        entry["global_ranks"] = [*entry["global_ranks"][:-1], rng.choice((2**63, 2**64))]
    write_json(m, name, doc)
    m.note(f"{name}: {how}", True)
    return True


def second_info(rng: random.Random, m: Mutant) -> bool:
    """A second profiler_info_*.json in a rank's profile folder (one copied under another
    rank's number)."""
    infos = [n for n in m.files if re.search(r"(^|/)profiler_info_\d+\.json$", n)]
    if not infos:
        return False
    name = rng.choice(infos)
    other = re.sub(r"_(\d+)\.json$", lambda f: f"_{int(f[1]) + 100}.json", name)
    m.files[other] = m.files[name]
    m.note(f"{name}: copied as {other.rsplit('/', 1)[-1]} beside it", True)
    return True


def _pick(rng: random.Random, m: Mutant, suffix: str) -> str | None:
    names = [n for n in m.files if n.endswith(suffix)]
    return rng.choice(names) if names else None


def _replace_values(text: str, key: str, value: str) -> str:
    out, at = [], 0
    needle = f'"{key}":'
    while (found := text.find(needle, at)) >= 0:
        start = found + len(needle)
        end = start
        while end < len(text) and text[end] not in ",}":
            end += 1
        out += [text[at:start], " ", value]
        at = end
    return "".join([*out, text[at:]])


def container(rng: random.Random, m: Mutant) -> bool:
    """Packed as tar / tar.gz / zip, sometimes hostile: cut, links, '..', absolute, deep names,
    devices, an unsupported zip method, a garbage zip directory, a name flagged UTF-8 that is
    not."""
    if m.pack != "dir" or m.played & _FOLDER_ONLY:  # those tricks do not survive packing
        return False
    odd_bytes = any(name != os.fsencode(name).decode("utf-8", "replace") for name in m.files)
    m.pack = rng.choice(("tar", "tar.gz") if odd_bytes else ("tar", "tar.gz", "zip"))
    how = rng.choice(("plain", "plain", "cut", "symlink member", "dotdot", "absolute", "deep",
                      "device", "end cut", "8 GiB claim",
                      *(() if odd_bytes else ("zip method", "zip directory", "zip utf-8",
                                              "zip folder data", "zip home name"))))
    if how == "plain":
        m.note(f"packed as {m.pack}", False)
        return True
    if how.startswith("zip"):
        m.pack = "zip"
        m.archive_tricks.append(partial(_zip_trick, how=how, junk=rng.randbytes(1 << 12)))
    elif how == "cut":
        m.pack = "tar.gz"
        m.archive_tricks.append(partial(_cut, fraction=rng.uniform(0.05, 0.9)))
    elif how == "end cut":  # the members whole: only the archive's end (or stream's) missing
        m.pack = rng.choice(("tar", "tar.gz", "tar.xz", "tar.bz2"))
        m.archive_tricks.append(partial(_end_cut, tail=rng.choice((4, 8, 40))))
    elif how == "8 GiB claim":
        m.pack = "tar"
        m.archive_tricks.append(_huge_claim)
    else:
        m.pack = rng.choice(("tar", "tar.gz"))
        m.archive_tricks.append(partial(_tar_trick, how=how))
    m.note(f"packed as {m.pack}, {how}", True)
    return True


def _tar_trick(path: Path, how: str) -> None:
    """Append a hostile member (rewrites the archive: tarfile cannot append to .gz)."""
    gz = path.name.endswith(".gz")
    with tarfile.open(path, "r:*") as tar:
        members = [(info, tar.extractfile(info).read() if info.isfile() else b"")
                   for info in tar.getmembers()]
    info = tarfile.TarInfo({"symlink member": "a/link.json", "dotdot": "../escape.json",
                            "absolute": "/etc/escape.json", "deep": "d/" * 70 + "x.json",
                            "device": "a/dev.json"}[how])
    if how == "symlink member":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif how == "device":
        info.type = tarfile.CHRTYPE
    members.insert(0, (info, b"{}" if info.isfile() else b""))
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        for member, data in members:
            member.size = len(data) if member.isfile() else 0
            tar.addfile(member, io.BytesIO(data) if member.isfile() else None)


def _cut(path: Path, fraction: float) -> None:
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * fraction)])


def _tar_end(path: Path) -> int:
    """Where a plain tar's last member ends (its end-of-archive blocks follow)."""
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    return last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _end_cut(path: Path, tail: int) -> None:
    """A plain tar without its end-of-archive blocks; a compressed one without its last
    `tail` bytes (the stream's end marker, checksum or size)."""
    data = path.read_bytes()
    path.write_bytes(data[:_tar_end(path)] if path.name.endswith(".tar") else data[:-tail])


def _huge_claim(path: Path) -> None:
    """A last member whose header claims 8 GiB, its data 1000 bytes: a tar cut while written."""
    header = tarfile.TarInfo("huge.bin")
    header.size = 8 << 30
    data = path.read_bytes()[:_tar_end(path)]
    path.write_bytes(data + header.tobuf(format=tarfile.GNU_FORMAT) + bytes(1000))


def _zip_trick(path: Path, how: str, junk: bytes) -> None:
    raw = bytearray(path.read_bytes())
    central = raw.find(b"PK\x01\x02")
    if how == "zip method":  # every member: method 99, in the local and the central header
        at = 0
        while (at := raw.find(b"PK\x03\x04", at)) >= 0:
            raw[at + 8:at + 10] = (99).to_bytes(2, "little")
            at += 4
        at = central
        while (at := raw.find(b"PK\x01\x02", at)) >= 0:
            raw[at + 10:at + 12] = (99).to_bytes(2, "little")
            at += 4
    elif how == "zip directory":
        end = len(raw) - 22
        raw[central:end] = (junk * (1 + (end - central) // len(junk)))[: end - central]
    elif how in ("zip folder data", "zip home name"):
        _zip_member(path, how)
        return
    else:  # first name: a byte that is no UTF-8, with the UTF-8 flag (bit 11) set
        for sig, flags, name in ((b"PK\x03\x04", 6, 30), (b"PK\x01\x02", 8, 46)):
            at = raw.find(sig)
            raw[at + flags + 1] |= 0x08
            raw[at + name] = 0xFF
    path.write_bytes(bytes(raw))


def _zip_member(path: Path, how: str) -> None:
    """One more member: a folder entry holding data, or a file named ~/…"""
    with zipfile.ZipFile(path, "a") as out:
        if how == "zip folder data":
            out.writestr(zipfile.ZipInfo("extra/"), b"bytes a folder cannot hold")
        else:
            out.writestr("~/.profile.json", b"{}")


def folder(rng: random.Random, m: Mutant) -> bool:
    """Folder tricks: symlink loops and escapes, a fifo, odd and non-UTF-8 file names, deep
    folders."""
    how = rng.choice(("loop", "escape", "fifo", "odd name", "bytes name", "deep"))
    if how in m.played or (m.pack != "dir" and how in _FOLDER_ONLY) or (
            m.pack == "zip" and how == "bytes name"):  # zipfile cannot write such a name
        return False
    m.played.add(how)
    told = how in ("loop", "escape", "fifo", "deep")
    if how == "odd name" or how == "bytes name":
        if m.seed.format != "kineto":
            return False
        victim = rng.choice(m.traces())
        odd = rng.choice(("a\nb", "[/x]", "a\rb", "\x1b[2J")) if how == "odd name" else \
            os.fsdecode(b"\xff\xfe")
        stem = victim.rsplit("/", 1)[-1]
        m.files[victim.replace(stem, odd + stem)] = m.files.pop(victim)
    else:
        m.tricks.append(partial(_folder_trick, how=how))
    m.note(f"folder: {how}", told)
    return True


_FOLDER_ONLY = {"loop", "escape", "fifo", "deep"}  # tricks on the written folder itself


def _folder_trick(path: Path, how: str) -> None:
    if how == "loop":
        (path / "l1").symlink_to(path / "l2")
        (path / "l2").symlink_to(path / "l1")
    elif how == "escape":
        (path / "out.json").symlink_to("/etc/hostname")
    elif how == "fifo":
        os.mkfifo(path / "pipe.json")
    else:
        deep = path.joinpath(*["d"] * 70)
        deep.mkdir(parents=True)
        (deep / "x.txt").write_text("")


MUTATIONS: tuple[tuple[Callable[[random.Random, Mutant], bool], int], ...] = (
    (bad_event_field, 12), (negate_times, 3), (negative_durations, 3), (strip_field, 5),
    (degenerate_events, 4), (deep_nesting, 2), (long_names, 1), (odd_names, 4),
    (step_number, 2), (distributed_info, 5), (rank_set, 5), (truncate, 5), (byte_damage, 6),
    (side_files, 6), (container, 6), (folder, 4), (second_info, 2),
)


# --- commands and options ------------------------------------------------------------------------
def command(rng: random.Random) -> tuple[list[str], bool]:
    """A command line with {bundle} and {out} placeholders, and whether an option is hostile
    (then a usage error, exit 2, is a fine answer)."""
    which = rng.choices(("analyze", "json", "inventory", "export", "graph", "report", "check",
                         "diff"), (6, 4, 2, 3, 2, 1, 1, 1))[0]
    args = {"analyze": ["analyze", "{bundle}", "--top", "3"],
            "json": ["analyze", "{bundle}", "--json"],
            "inventory": ["analyze", "{bundle}", "--inventory-only"],
            "export": ["export", "{bundle}", "--parquet", "{out}/tables"],
            "graph": ["graph", "{bundle}", "-o", "{out}/graph.json"],
            "report": ["report", "{bundle}", "-o", "{out}/report.html"],
            "check": ["check", "{bundle}", "--preset", "hsdp-async-reduction"],
            "diff": ["diff", "{bundle}", "{bundle}", "--markdown", "{out}/diff.md"]}[which]
    hostile = False
    if rng.random() < 0.1 and which in ("analyze", "json", "graph", "report", "check", "diff"):
        args += ["--threshold-ms", rng.choice(("nan", "inf", "-1", "1e308", "0"))]
        hostile = True
    if rng.random() < 0.05 and which in ("analyze", "json", "report"):
        args += ["--step", rng.choice(("-1", "99999999999", "0"))]
    if rng.random() < 0.05:  # written by `run` beside the outputs, never beside the input
        args += ["--rank-map", "{out}/map.json"]
        hostile = True
    args += ["--jobs", "2"] if rng.random() < 0.05 else ["--jobs", "1"]
    return args, hostile


# --- cases ---------------------------------------------------------------------------------------
@dataclass
class Case:
    number: int
    mutant: Mutant
    args: list[str]
    hostile_option: bool
    cache: str  # none | fresh | poisoned

    def __str__(self) -> str:
        return (f"case {self.number} [{self.mutant.seed.name}]: {'; '.join(self.mutant.what)}"
                f" | {' '.join(self.args)} | cache {self.cache}")


def case(number: int) -> Case:
    """The case numbered `number`: the same mutant and command every time."""
    rng = random.Random(number)
    seed = rng.choices(SEEDS, SEED_WEIGHTS)[0]
    mutant = Mutant(seed, seed.files())
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        for _ in range(20):  # draw until one applies
            mutation = rng.choices([f for f, _ in MUTATIONS], [w for _, w in MUTATIONS])[0]
            if _applied(mutation, rng, mutant):
                break
    args, hostile = command(rng)
    cache_mode = rng.choices(("none", "fresh", "poisoned"), (6, 2, 2))[0]
    return Case(number, mutant, args, hostile, cache_mode)


def _applied(mutation: Callable[[random.Random, Mutant], bool], rng: random.Random,
             mutant: Mutant) -> bool:
    """Whether `mutation` applied; one that cannot read what an earlier one left (a file already
    garbage, a rank already gone) does not."""
    try:
        applied = mutation(rng, mutant)
    except (ValueError, IndexError, KeyError, TypeError, AttributeError, EOFError, OSError,
            RecursionError):
        return False
    if applied:
        mutant.mutations.append(mutation.__name__)
    return applied


def write(mutant: Mutant, where: Path) -> Path:
    """The mutant on disk under `where` (a folder, one file, or an archive of the folder)."""
    folder_path = where / f"{mutant.seed.name}"
    for name, data in mutant.files.items():
        path = folder_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for trick in mutant.tricks:
        trick(folder_path)
    if mutant.pack == "dir":
        return folder_path
    archive = where / f"{mutant.seed.name}.{mutant.pack}"
    if mutant.pack == "zip":
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
            for path in sorted(folder_path.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    out.write(path, path.relative_to(where).as_posix())
    else:
        with tarfile.open(archive, f"w:{mutant.pack[4:]}") as out:  # tar.gz -> w:gz
            out.add(folder_path, folder_path.name,
                    filter=lambda info: None if info.issym() or info.isfifo() else info)
    for trick in mutant.archive_tricks:
        trick(archive)
    shutil.rmtree(folder_path)
    return archive


def fingerprint(root: Path) -> dict[str, str]:
    """Every entry under `root` (links not followed): its kind and content digest."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            mode = path.lstat().st_mode
            rel = os.fsencode(path.relative_to(root)).hex()
            if stat.S_ISREG(mode):
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif stat.S_ISLNK(mode):
                found[rel] = "link " + os.readlink(path)
            else:
                found[rel] = f"mode {stat.S_IFMT(mode)}"
    return found


@dataclass
class Ran:
    """What one command line did."""

    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None = None  # escaped from the command (in-process runs)


@dataclass
class Outcome:
    case: Case
    exit_code: int
    seconds: float
    failure: str | None


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def ring(signum: int, frame: object) -> None:
        raise _Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def in_process(args: list[str]) -> Ran:
    """The command line run in this process (typer's CliRunner), an alarm against hangs."""
    with _deadline(CASE_SECONDS):
        result = CliRunner().invoke(app, args)
    escaped = result.exception if not isinstance(result.exception, SystemExit) else None
    return Ran(result.exit_code, result.stdout, result.stderr, escaped)


def in_subprocess(args: list[str]) -> Ran:
    """The command line run as a user runs it: `python -m tracegraph` in a fresh process."""
    try:
        done = subprocess.run([sys.executable, "-m", "tracegraph", *args], capture_output=True,
                              timeout=CASE_SECONDS, cwd=Path(__file__).parents[1])
    except subprocess.TimeoutExpired:
        return Ran(-1, "", "", _Hang(f"still running after {CASE_SECONDS} s"))
    decode = partial(bytes.decode, encoding="utf-8", errors="backslashreplace")
    return Ran(done.returncode, decode(done.stdout), decode(done.stderr))


def run(the_case: Case, workdir: Path, invoke: Callable[[list[str]], Ran] = in_process
        ) -> Outcome:
    """Run one case under `workdir` (removed afterwards) and check its properties."""
    inputs, outputs, cache_dir = workdir / "in", workdir / "out", workdir / "cache"
    for path in (inputs, outputs):
        path.mkdir(parents=True)
    try:
        try:
            bundle = write(the_case.mutant, inputs)
        except Exception as error:  # the fuzzer's fault, not the tool's: a failure all the same
            return Outcome(the_case, -1, 0.0, f"the fuzzer could not write it: {error!r}")
        (outputs / "map.json").write_text(RANK_MAPS[the_case.number % len(RANK_MAPS)])
        args = [a.format(bundle=bundle, out=outputs) for a in the_case.args]
        args += ["--no-cache"] if the_case.cache == "none" else ["--cache-dir", str(cache_dir)]
        if the_case.cache == "poisoned":
            _poison(invoke, args, cache_dir)
        before = fingerprint(inputs)
        started = time.perf_counter()
        ran = invoke(args)
        seconds = time.perf_counter() - started
        failure = judge(the_case, ran, bundle, before == fingerprint(inputs))
        return Outcome(the_case, ran.exit_code, seconds, failure)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


RANK_MAPS = ('{"rank0.json": 4294967296}', '{"rank0.json": "abc"}', "[1, 2]", "{", '{"x": -3}',
             '{"rank1.json": 0}')
POISONS = ('{"rank": "x"}', "[]", '{"rank": 0, "groups": 5, "meta": {}, "warnings": []}',
           '{"rank": 4294967296, "groups": [], "meta": {}, "warnings": []}', "garbage")


def _poison(invoke: Callable[[list[str]], Ran], args: list[str], cache_dir: Path) -> None:
    """Fill the cache with a first run, then damage every entry's meta.json or events file."""
    invoke(args)
    rng = random.Random(" ".join(args))
    for entry in sorted(cache_dir.glob("*/meta.json")):
        if rng.random() < 0.2:
            (entry.parent / "events.arrow").write_bytes(b"ARROW1 not really")
        else:
            entry.write_text(rng.choice(POISONS))


def judge(the_case: Case, ran: Ran, bundle: Path, unchanged: bool) -> str | None:
    """What is wrong with a case's run, or None."""
    if ran.exception is not None:
        frames = traceback.extract_tb(ran.exception.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        return f"{type(ran.exception).__name__}: {str(ran.exception)[:300]}{where}"
    if ran.exit_code not in (0, 1, 2):
        return f"exit code {ran.exit_code}"
    if "Traceback" in ran.stderr or "Traceback" in ran.stdout:
        return "a traceback was printed"
    if not unchanged:
        return "the input changed (or something was written beside it)"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if peak > MEMORY_BYTES:
        return f"peak memory {peak / MIB:.0f} MiB"
    usage = "Usage:" in ran.stderr or "Invalid value" in ran.stderr
    if usage and not the_case.hostile_option:
        return f"a usage error for a sound command line: {ran.stderr[-300:]!r}"
    if ran.exit_code == 2 and not usage:
        lines = [line for line in ran.stderr.splitlines() if not line.startswith("warning:")]
        if len(lines) != 1 or not lines[0].startswith("error: "):
            return f"exit 2 without one error line: {ran.stderr[-300:]!r}"
        if not _names_the_input(lines[0], bundle):
            return f"the error names no input: {lines[0][:300]!r}"
    told = ran.exit_code == 2 or "warning:" in ran.stderr
    if the_case.mutant.damaged and not told:
        return "damaged input analysed without a warning"
    return None


def _names_the_input(line: str, bundle: Path) -> bool:
    """Whether an error line names the bundle or one of its files, as `printable` shows them."""
    return any(name in line for name in (printable(bundle.name), ".json", ".csv", "cache"))


def run_many(numbers: Iterable[int], workdir: Path) -> list[Outcome]:
    """Run the cases numbered `numbers` one after another, in this process."""
    return [run(case(n), workdir / f"case{n}") for n in numbers]
