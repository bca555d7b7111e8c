"""The trace-format registry: each format says which inputs are its own, discovery and
`parse_rank` consult only `parsers.formats.FORMATS`.

Known answers were read by hand (see ../shared/real_traces/README.md and tests/test_bundle.py):
every file under real_traces/kineto is a Kineto trace (27 files; opening the tree lists them all
as profiles, no JSON ignored), none under real_traces/ascend is (their JSON heads are `[{"ph"...`
arrays or `{"step..."`, `{"config"...`, `{"distributed_args"...` objects). The torch_npu rank
folders are the 10 `rank*_ascend_pt` / `test_rank_{0,1}` folders, each holding
`profiler_info_{rank}.json` (`find real_traces -name 'profiler_info*'`). The fake format below is
built here: its answers hold by construction.
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tracegraph
from parsers import ascend, formats, kineto, parse_rank
from parsers.archive import HEAD_BYTES
from parsers.base import Format, ParsedRank, RankFiles, Reader, Sniff, TraceError
from parsers.bundle import open_bundle
from tracegraph import schema

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "real_traces"
ASCEND_RANK_FOLDERS = {
    *(f"ascend/torch_npu_ddp8_level1/rank{r}_ascend_pt" for r in (0, 1)),
    *(f"ascend/torch_npu_ddp8_db_level1/rank{r}_ascend_pt" for r in (0, 1)),
    *(f"ascend/torch_npu_pp2dp2_level2_comm/rank_{r}_ascend_pt" for r in range(4)),
    *(f"ascend/torch_npu_2023_comm/test_rank_{r}" for r in (0, 1)),
}
FAKE_MAGIC = re.compile(rb"^FAKETRACE(?: rank=(\d+))?\n")  # the rank is optional


def real(rel: str) -> Path:
    """A path under ../shared/real_traces; fails (never skips) when the tree is absent."""
    path = REAL / rel
    assert path.exists(), f"{path} is missing: ../shared must sit beside the clone"
    return path


def head(path: Path) -> bytes:
    """A file's first bytes as discovery sees them (gunzipped for .gz)."""
    with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as file:
        return file.read(HEAD_BYTES)


def items(folder: Path) -> set[str]:
    """A folder's files and `sub/` folders, as discovery lists them."""
    return {p.name + "/" if p.is_dir() else p.name for p in folder.iterdir()}


def files_under(rel: str) -> list[Path]:
    return sorted(p for p in real(rel).rglob("*") if p.is_file())


# -- each format recognizes its own real inputs and refuses the other's -------------------------
def test_kineto_recognizes_every_real_kineto_trace():
    traces = files_under("kineto")
    assert len(traces) == 27
    refused = [p for p in traces if not kineto.recognizes(p.name, head(p))]
    assert refused == []
    assert kineto.sniff("rank3.json", head(real("kineto/gloo_pp2_dp2/rank3.json"))) == (True, 3)


def test_kineto_refuses_every_real_ascend_file():
    ascend_files = files_under("ascend")
    assert any(p.name == "trace_view.json" for p in ascend_files)  # Chrome-like event arrays
    taken = [p for p in ascend_files if kineto.recognizes(p.name, head(p))]
    assert taken == []
    assert not kineto.recognizes("rank0.txt", head(real("kineto/gloo_pp2_dp2/rank0.json")))


def test_ascend_recognizes_exactly_the_real_rank_folders():
    folders = [p for p in REAL.rglob("*") if p.is_dir()]
    found = {str(p.relative_to(REAL)) for p in folders if ascend.recognizes(p.name, items(p))}
    assert found == ASCEND_RANK_FOLDERS  # no Kineto folder, no cluster or APO folder


@pytest.mark.parametrize(("folder", "held", "answer"), [
    ("job", {"profiler_info_3.json", "FRAMEWORK/"}, True),
    ("job", {"profiler_info.json"}, True),  # a single-rank run names no rank
    ("job", {"ASCEND_PROFILER_OUTPUT/"}, True),
    ("w_1700000000000_ascend_ms", set(), True),
    ("job", {"ASCEND_PROFILER_OUTPUT", "profiler_metadata.json", "info.json"}, False),
    ("PROF_000001_20240101000000_ABC", {"device_0/", "host/"}, False),  # found by its info files
])
def test_ascend_recognizes_by_folder_name_and_items(folder, held, answer):
    assert ascend.recognizes(folder, held) is answer


def test_ascend_refuses_kineto_files():
    """Ascend sees the first bytes of a JSON file outside any profile folder (a bare trace may
    be one rank's), and refuses every Kineto trace."""
    for trace in files_under("kineto"):
        assert not ascend.recognizes(trace.name, set())
        assert not ascend.FORMAT.sniff(trace.name, head(trace)).profile
    bare = real("ascend/msprof_analyze_single/test/ut/advisor/timeline_advice/trace_view.json")
    assert ascend.FORMAT.sniff(bare.name, head(bare)).profile


@pytest.mark.parametrize("fmt", formats.FORMATS, ids=lambda fmt: fmt.name)
def test_registered_alone_each_format_finds_only_its_own(monkeypatch, fmt):
    own, other = {"kineto": ("kineto/gloo_pp2_dp2", "ascend/torch_npu_ddp8_level1"),
                  "ascend": ("ascend/torch_npu_ddp8_level1", "kineto/gloo_pp2_dp2"),
                  "ascend_db": ("ascend/torch_npu_ddp8_db_level1", "ascend/torch_npu_ddp8_level1"),
                  "ascend_prof": ("ascend/mindspore_graph_ddp2_prof",
                                  "ascend/torch_npu_ddp8_level1"),
                  "nsys": ("nsys", "kineto/gloo_pp2_dp2"),
                  }[fmt.name]
    monkeypatch.setattr(formats, "FORMATS", (fmt,))
    found = open_bundle(real(own)).profiles
    assert {p.format for p in found} == {fmt.name}
    assert [p.rank for p in found] == {"kineto": [0, 1, 2, 3], "nsys": [None, None]}.get(
        fmt.name, [0, 1])  # the real nsys exports state no rank
    with pytest.raises(TraceError, match=f"no {fmt.family} profile found"):
        open_bundle(real(other))


# -- the registry is the only list of formats ----------------------------------------------------
@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A Kineto rank file and an Ascend rank folder side by side."""
    shutil.copy(real("kineto/gloo_pp2_dp2/rank2.json"), tmp_path / "rank2.json")
    shutil.copytree(real("ascend/torch_npu_ddp8_level1/rank1_ascend_pt"),
                    tmp_path / "rank1_ascend_pt")
    return tmp_path


def test_mixed_folder_finds_both_through_the_registry(monkeypatch, mixed):
    assert [(p.format, p.root, p.rank) for p in open_bundle(mixed).profiles] == [
        ("ascend", "rank1_ascend_pt", 1), ("kineto", "rank2.json", 2)]
    monkeypatch.setattr(formats, "FORMATS", ())
    with pytest.raises(TraceError, match="profile found"):
        open_bundle(mixed)


def test_parse_rank_dispatches_through_the_registry(monkeypatch):
    files = RankFiles("kineto", "rank0.json", {"trace": "rank0.json"}, 0)
    data = real("kineto/gloo_pp2_dp2/rank0.json").read_bytes()
    assert parse_rank(files, {"rank0.json": data}.__getitem__).rank == 0
    monkeypatch.setattr(formats, "FORMATS", (ascend.FORMAT,))
    with pytest.raises(TraceError, match="unknown profile format 'kineto'"):
        parse_rank(files, {"rank0.json": data}.__getitem__)


# -- a third format plugs in with one registry entry ---------------------------------------------
def fake_sniff(name: str, head: bytes) -> Sniff:
    found = FAKE_MAGIC.match(head)
    return Sniff(bool(found), int(found[1]) if found and found[1] else None)


def fake_parse(files: RankFiles, read: Reader) -> ParsedRank:
    """One event per line after the magic line: `name start_ns dur_ns`."""
    data = read(files.files["trace"])
    rank = fake_sniff("", data).rank
    rank = files.rank if rank is None else rank
    rows = [line.split() for line in data.decode().splitlines()[1:]]
    n = len(rows)
    events = schema.events_table({
        "rank": [rank] * n, "lane": ["fake"] * n, "lane_kind": [schema.THREAD] * n,
        "name": [r[0] for r in rows], "kind": [schema.COMPUTE] * n,
        "start_ns": [int(r[1]) for r in rows], "dur_ns": [int(r[2]) for r in rows]}, n)
    return ParsedRank(rank=rank, events=events, meta={"framework": "fake"})


FAKE = Format(name="fake", looked_for="*.fake traces", parse=fake_parse,
              wants=lambda name: name.endswith(".fake"), sniff=fake_sniff, suffixes=(".fake",))


def test_third_format_is_discovered_and_parsed(monkeypatch, mixed):
    monkeypatch.setattr(formats, "FORMATS", (*formats.FORMATS, FAKE))
    (mixed / "job").mkdir()
    (mixed / "job" / "a.fake").write_bytes(b"FAKETRACE rank=5\nmatmul 100 40\nrelu 140 5\n")
    (mixed / "job" / "worker7.fake").write_bytes(b"FAKETRACE\nmatmul 0 9\n")  # name rank
    (mixed / "rank1_ascend_pt" / "b.fake").write_bytes(b"FAKETRACE rank=9\n")  # Ascend's member
    with open_bundle(mixed) as bundle:
        assert [(p.format, p.root, p.rank) for p in bundle.profiles] == [
            ("ascend", "rank1_ascend_pt", 1), ("kineto", "rank2.json", 2),
            ("fake", "job/a.fake", 5), ("fake", "job/worker7.fake", 7)]
        parsed = parse_rank(bundle.profiles[2], bundle.read)
    assert parsed.rank == 5 and parsed.events.column("name").to_pylist() == ["matmul", "relu"]


def test_third_format_loads_end_to_end(monkeypatch, tmp_path):
    monkeypatch.setattr(formats, "FORMATS", (*formats.FORMATS, FAKE))
    (tmp_path / "worker3.fake").write_bytes(b"FAKETRACE\nmatmul 0 9\n")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(TraceError, match=r"notes\.txt: .* or a trace file \(\.json, .*, \.fake\)"):
        open_bundle(tmp_path / "notes.txt")
    trace = tracegraph.load(tmp_path / "worker3.fake", use_cache=False, jobs=1)
    assert trace.rank_ids == [3]
    assert trace.ranks["format"].tolist() == ["fake"]
    assert trace.events["name"].tolist() == ["matmul"]


def spying(monkeypatch, registry: tuple[Format, ...]) -> list[str]:
    """Register `registry` with Kineto's sniff recording the members it is shown."""
    seen: list[str] = []

    def sniff(name: str, head: bytes) -> Sniff:
        seen.append(name)
        return kineto.sniff(name, head)

    spy = dataclasses.replace(kineto.FORMAT, sniff=sniff)
    monkeypatch.setattr(formats, "FORMATS", tuple(spy if f is kineto.FORMAT else f
                                                  for f in registry))
    return seen


def test_kineto_never_reads_inside_ascend_folders(monkeypatch, mixed):
    seen = spying(monkeypatch, formats.FORMATS)
    assert len(open_bundle(mixed).profiles) == 2
    assert seen == ["rank2.json"]  # not rank1_ascend_pt/**/*.json: Ascend encloses them


def test_earlier_format_owns_its_folders(monkeypatch, tmp_path):
    """A folder format registered first takes the Kineto-looking files inside its folders."""
    def find(names, sniffs, label, notes):
        inside = [n for n in names if n.startswith("x.fakedir/")]
        profile = RankFiles("fakedir", "x.fakedir", {"trace": inside[0]}, 0)
        return [profile], [n for n in names if n not in inside]

    fakedir = Format(name="fakedir", looked_for="*.fakedir folders", parse=fake_parse,
                     wants=lambda name: False, sniff=fake_sniff, find=find,
                     encloses=lambda name: name.startswith("x.fakedir/"))
    seen = spying(monkeypatch, (fakedir, kineto.FORMAT))
    (tmp_path / "x.fakedir").mkdir()
    for name in ("rank0.json", "rank1.json"):
        shutil.copy(real("kineto/gloo_pp2_dp2") / name, tmp_path / "x.fakedir" / name)
    shutil.copy(real("kineto/gloo_pp2_dp2/rank1.json"), tmp_path / "rank1.json")
    assert [(p.format, p.root) for p in open_bundle(tmp_path).profiles] == [
        ("fakedir", "x.fakedir"), ("kineto", "rank1.json")]
    assert seen == ["rank1.json"]


# -- parsers/ stays apart from the rest of tracegraph --------------------------------------------
def imported(source: Path) -> set[str]:
    """The modules a file imports anywhere (`from a import b` counts as `a` and `a.b`)."""
    names = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_parsers_import_only_the_schema_from_tracegraph():
    """...and the heap (a leaf the schema loads too), which a parser hands back memory to."""
    for source in (ROOT / "parsers").glob("*.py"):
        used = {name for name in imported(source) if name.split(".")[0] == "tracegraph"}
        assert {name for name in used if not name.startswith(("tracegraph.schema",
                                                              "tracegraph.heap"))} <= {
            "tracegraph"}, source  # `from tracegraph import schema` names only the package


def test_importing_parsers_stays_light():
    code = ("import sys, parsers, parsers.base; from parsers import TraceError\n"
            "assert 'pyarrow' not in sys.modules and 'parsers.formats' not in sys.modules\n"
            "import parsers.bundle, parsers.formats\n"
            "print(sorted(m for m in sys.modules if m.startswith('tracegraph')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["['tracegraph',", "'tracegraph.heap',", "'tracegraph.schema']"]
