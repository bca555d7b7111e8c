"""The simulated files against real ones: the simulated side has nothing the real side lacks.

Per event category (layer / process, phase, cat, task type) the simulated events' keys, arg names
and value types must all occur in the real files; so must thread-name patterns, the nested keys
of communication*.json, profiler_info / profiler_metadata and the CSV columns. The only allowed
differences are listed in the `*_DOCUMENTED` tables, each with the document that states it:
MindSpore's own names (the simulator writes `*_ascend_ms`, the real Ascend files are torch_npu's)
and the fields torch 2.12 / 2.13 added after the real Kineto fixtures were recorded. The
simulated `.db` export is held to the real torch_npu databases table by table: every table and
column it writes, with the same declared type, and the strings its type columns name; a job that
profiles memory (`pp-memory`) gets the memory table its text export has, one that does not gets
none.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterable
from decimal import Decimal
from pathlib import Path

import pytest

from parsers.ascend_memory import DB_TABLES as MEMORY_TABLES
from tests.test_simulate_writers import hand_timeline, materialize
from tracegraph.simulate import simulate, write_ascend, write_ascend_db, write_kineto

ASCEND_DOCUMENTED = {  # simulated (MindSpore) -> real (torch_npu) equivalent; ascend.md §2.2, §2.6
    "MindSpore": "Python",  # framework layer: TimelineLayerName.MINDSPORE vs torch_npu's Python
    "mindspore_to_npu": "torch_to_npu",  # framework -> device flow name
    "ms_version": "torch_npu_version",  # profiler_info: MindSpore writes its own version key
}
ASCEND_DOCUMENTED_TYPES = {("async_npu", "id"): {"str"}}  # MindSpore's flow id is str(end.ts)
KINETO_DOCUMENTED_ARGS = {  # kineto.md §0, §3, §6: torch 2.12 `Seq`, 2.13 `Comms Id`, P2P ranks
    ("X", "cpu_op", "record_param_comms"): {"Seq", "Comms Id", "Rank", "Dst Rank", "Src Rank"},
    ("X", "kernel", "nccl"): {"Seq", "Comms Id", "Dst Rank", "Src Rank"},
}
KINETO_DOCUMENTED_NAMES = {"nccl:send N->N", "nccl:recv N<-N", "nccl:coalesced"}  # kineto.md §5
RELATIVE_TS_LIMIT_US = 7_889_238e6  # kineto floors baseTimeNanoseconds to ~3 months


# --- generic shape extraction ------------------------------------------------------------------

def kind(value: object) -> str:
    """The JSON type of a value: str, number, bool, null, dict or list."""
    names = {bool: "bool", str: "str", dict: "dict", list: "list", type(None): "null"}
    return names.get(type(value), "number")


class Shapes:
    """Per event category: top-level keys and arg names, each with the value types seen."""

    def __init__(self) -> None:
        self.keys: dict[tuple, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self.args: dict[tuple, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))

    def add(self, category: tuple, event: dict) -> None:
        for key, value in event.items():
            if key != "args":
                self.keys[category][key].add(kind(value))
        for key, value in (event.get("args") or {}).items():
            self.args[category][key].add(kind(value))


def extra(sim: Shapes, real: Shapes, allowed_args: dict[tuple, set[str]] | None = None,
          allowed_types: dict[tuple, set[str]] | None = None) -> list[str]:
    """Everything the simulated shapes have that the real ones lack, one line each."""
    allowed_args, allowed_types = allowed_args or {}, allowed_types or {}
    found = []
    for category in sim.keys:
        if category not in real.keys:
            found.append(f"{category}: category absent from the real files")
            continue
        for where, sim_map, real_map in (("key", sim.keys, real.keys),
                                         ("arg", sim.args, real.args)):
            for key, types in sim_map[category].items():
                if where == "arg" and key in allowed_args.get(category, ()):
                    continue
                if key not in real_map[category]:
                    found.append(f"{category}: {where} {key!r} absent from the real files")
                    continue
                wanted = real_map[category][key] | allowed_types.get((category[2], key), set())
                if types - wanted:
                    found.append(f"{category}: {where} {key!r} has types {sorted(types)}, "
                                 f"real {sorted(real_map[category][key])}")
    return found


def tree(value: object, name: Callable[[str, str], str], path: tuple = ()) -> set[tuple]:
    """(path of normalized keys, JSON type) of every node of a nested JSON document."""
    nodes = {(path, kind(value))}
    if isinstance(value, dict):
        for key, child in value.items():
            nodes |= tree(child, name, (*path, name(path[-1] if path else "", key)))
    return nodes


def pattern(text: str) -> str:
    """A name with its numbers replaced by N: `Stream 47` -> `Stream N`."""
    return re.sub(r"\d+", "N", text)


# --- Ascend ------------------------------------------------------------------------------------

def ascend_real(real: Path) -> Path:
    return real / "ascend"


@pytest.fixture(scope="module")
def sim_ascend() -> dict[str, bytes]:
    return materialize(write_ascend.iter_files(hand_timeline()))


def sim_ascend_docs(files: dict[str, bytes], name: str) -> list[object]:
    return [json.loads(data) for path, data in sorted(files.items()) if path.endswith("/" + name)]


def ascend_category(event: dict, layers: dict, threads: dict) -> tuple:
    layer = layers.get(event.get("pid"), "?")
    layer = ASCEND_DOCUMENTED.get(layer, layer)
    ph, cat, name = event["ph"], event.get("cat", ""), event.get("name", "")
    if ph == "M":
        sub = name
    elif ph in "sf":
        sub = ASCEND_DOCUMENTED.get(name, name) if cat != "HostToDevice" else "HostToDevice"
    elif layer == "Ascend Hardware":
        sub = event["args"]["Task Type"]
    elif layer == "HCCL":
        thread = threads.get((event["pid"], event["tid"]), "")
        sub = "op" if thread.endswith("Communication") else name
    elif layer == "CANN":
        sub = name.split("@")[0]
    else:
        sub = "ProfilerStep" if name.startswith("ProfilerStep#") else "op"
    return layer, ph, cat, sub


def ascend_shapes(traces: Iterable[list[dict]]) -> tuple[Shapes, dict[str, set[str]]]:
    """Shapes of trace_view events, and thread-name patterns per layer."""
    shapes, names = Shapes(), defaultdict(set)
    for events in traces:
        layers = {e["pid"]: e["args"]["name"] for e in events
                  if e["ph"] == "M" and e["name"] == "process_name"}
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                   if e["ph"] == "M" and e["name"] == "thread_name"}
        for (pid, _), thread in threads.items():
            layer = layers[pid]
            names[ASCEND_DOCUMENTED.get(layer, layer)].add(pattern(thread))
        for event in events:
            shapes.add(ascend_category(event, layers, threads), event)
    return shapes, names


@pytest.fixture(scope="module")
def real_trace_view(real: Path) -> list[dict]:
    path = ascend_real(real) / "torch_npu_ddp8_level1/rank0_ascend_pt/ASCEND_PROFILER_OUTPUT"
    return json.loads((path / "trace_view.json").read_bytes())


def test_ascend_trace_view_has_nothing_the_real_one_lacks(sim_ascend, real_trace_view):
    sim, _ = ascend_shapes(sim_ascend_docs(sim_ascend, "trace_view.json"))
    real, _ = ascend_shapes([real_trace_view])
    assert extra(sim, real, allowed_types=ASCEND_DOCUMENTED_TYPES) == []
    # the simulated side covers every device-side category the analyzer reads
    assert {c[3] for c in sim.keys if c[0] == "Ascend Hardware" and c[1] == "X"} == {
        "AI_CORE", "EVENT_WAIT_SQE", "EVENT_RECORD_SQE", "SDMA_SQE", "Write Value",
        "Notify Wait", "SDMA"}
    assert {c[3] for c in sim.keys if c[0] == "HCCL" and c[1] == "X"} == {
        "op", "Notify_Record", "Notify_Wait", "Memcpy", "Reduce_Inline"}


def test_the_structure_diff_catches_what_real_files_lack(sim_ascend, real_trace_view):
    events = sim_ascend_docs(sim_ascend, "trace_view.json")[0]
    wait = next(e for e in events if e.get("name") == "EVENT_WAIT")
    wait["args"]["event id"] = 7  # what a real profiler never writes
    wait["ts"] = float(wait["ts"])  # and a number where msprof writes a string
    sim, _ = ascend_shapes([events])
    real, _ = ascend_shapes([real_trace_view])
    found = extra(sim, real, allowed_types=ASCEND_DOCUMENTED_TYPES)
    assert len(found) == 2
    assert "arg 'event id' absent" in found[0] + found[1]
    assert "key 'ts' has types ['number', 'str']" in found[0] + found[1]


def test_ascend_thread_names_follow_real_patterns(sim_ascend, real_trace_view):
    _, sim = ascend_shapes(sim_ascend_docs(sim_ascend, "trace_view.json"))
    _, real = ascend_shapes([real_trace_view])
    assert sim == {"Python": {"Thread N"}, "CANN": {"Thread N"},
                   "Ascend Hardware": {"Stream N"},
                   "HCCL": {"Group N Communication", "Plane N"}}
    assert all(sim[layer] <= real[layer] for layer in sim)


def test_ascend_cann_calls_match_real(sim_ascend, real_trace_view):
    def calls(events: list[dict]) -> set[tuple[str, str, str]]:
        cann = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"
                and e["args"]["name"] == "CANN"}
        names = (re.sub(r"@(aclnn\w+|hcom_\w+_)$", lambda m: "@" + m[1][:5] + "*", e["name"])
                 for e in events if e["ph"] == "X" and e["pid"] in cann)
        modes = ((e["args"]["Mode"], e["args"]["level"]) for e in events
                 if e["ph"] == "X" and e["pid"] in cann)
        return set(zip(names, modes, strict=True))

    sim = set().union(*map(calls, sim_ascend_docs(sim_ascend, "trace_view.json")))
    assert sim <= calls(real_trace_view)
    assert {name for name, _ in sim} == {"AscendCL@aclnn*", "AscendCL@hcom_*", "Node@launch",
                                         "AscendCL@aclrtRecordEvent", "AscendCL@aclrtMemcpyAsync",
                                         "AscendCL@aclrtStreamWaitEvent"}


def test_ascend_times_share_units_with_real(sim_ascend, real_trace_view):
    for events in [*sim_ascend_docs(sim_ascend, "trace_view.json"), real_trace_view]:
        stamps = [Decimal(e["ts"]) for e in events if e["ph"] in "Xsf"]
        assert min(stamps) > 1.6e15 and max(stamps) < 1.9e15  # µs since the epoch, as strings
        hardware = [e["dur"] for e in events
                    if e["ph"] == "X" and "Task Type" in e.get("args", {})]
        assert min(hardware) >= 0 and max(hardware) < 1e7  # µs: no device task lasts 10 s


def comm_key(parent: str, key: str) -> str:
    """Normalize the variable keys of communication*.json and profiler_metadata.json."""
    if parent == "parallel_group_info":
        return "COMM"
    for regex, name in ((r"step\d+", "stepN"), (r"hcom_\w+?__\d{3}_\d+_\d+@\d+", "OP@GROUP"),
                        (r"\d+(\.\d+)?", "SIZE"), (r"\d+-\d+", "LINK")):
        if re.fullmatch(regex, key):
            return name
    found = re.fullmatch(r"\w+-(top1|middle|bottom\d|total)@\d+", key)
    return f"TYPE-{found[1]}@GROUP" if found else ASCEND_DOCUMENTED.get(key, key)


def real_comm_docs(real: Path, name: str) -> list[object]:
    folder = ascend_real(real) / "torch_npu_pp2dp2_level2_comm"
    return [json.loads(p.read_bytes()) for p in sorted(folder.glob(f"rank_*/*/{name}"))]


@pytest.mark.parametrize(("name", "deepest"), [
    ("communication.json", ("stepN", "p2p", "OP@GROUP", "Communication Time Info",
                            "Synchronization Time(ms)")),
    ("communication_matrix.json", ("stepN", "collective", "TYPE-top1@GROUP", "LINK", "Op Name")),
])
def test_communication_files_have_nothing_the_real_ones_lack(name, deepest, sim_ascend, real):
    real_docs = real_comm_docs(real, name)
    assert len(real_docs) == 4
    real_nodes = set().union(*(tree(doc, comm_key) for doc in real_docs))
    sim_nodes = set().union(*(tree(doc, comm_key) for doc in sim_ascend_docs(sim_ascend, name)))
    assert sim_nodes - real_nodes == set()
    assert {path for path, _ in sim_nodes} >= {deepest}  # the comparison reached the leaves


def test_profiler_info_and_metadata_have_nothing_the_real_ones_lack(sim_ascend, real):
    for name, real_paths in (
            ("profiler_info_*.json", ["torch_npu_pp2dp2_level2_comm/rank_0_ascend_pt",
                                      "torch_npu_ddp8_level1/rank0_ascend_pt"]),
            ("profiler_metadata.json", ["torch_npu_pp2dp2_level2_comm/rank_0_ascend_pt"])):
        real_nodes = set().union(*(
            tree(json.loads(p.read_bytes()), comm_key)
            for folder in real_paths for p in (ascend_real(real) / folder).glob(name)))
        sim = [json.loads(data) for path, data in sim_ascend.items()
               if re.search(name.replace("*", r"\d+").replace(".", r"\.") + "$", path)]
        assert len(sim) == 4 and real_nodes
        assert set().union(*(tree(doc, comm_key) for doc in sim)) - real_nodes == set()


def test_step_trace_time_columns_match_real(sim_ascend, real):
    folder = ascend_real(real) / "torch_npu_pp2dp2_level2_comm"
    headers = [next(csv.reader(io.StringIO(p.read_text())))
               for p in folder.glob("rank_*/*/step_trace_time.csv")]
    real_columns = set().union(*headers)
    assert len(headers) == 4
    for path, data in sim_ascend.items():
        if path.endswith("step_trace_time.csv"):
            header = next(csv.reader(io.StringIO(data.decode())))
            assert set(header) <= real_columns and "Device_id" in header


# --- Ascend .db export ---------------------------------------------------------------------------

ASCEND_DB_READ = {"STRING_IDS", "TASK", "COMPUTE_TASK_INFO", "COMMUNICATION_OP",
                  "COMMUNICATION_TASK_INFO", "CANN_API", "STEP_TIME", "RANK_DEVICE_MAP",
                  "META_DATA", "ENUM_API_TYPE", "ENUM_HCCL_DATA_TYPE"}  # what the parser reads
DB_DOCUMENTED_STRINGS = {  # simulated (MindSpore) -> real (torch_npu); docs/schema.md, memory
    "MindSpore": "PTA", "MindSpore+GE": "PTA+GE"}  # the framework allocator's components
MEMORY_JOB = "pp-memory"  # the scenario whose databases hold memory


def db_schema(path: Path) -> dict[str, dict[str, str]]:
    """Table -> column -> declared type of an SQLite file."""
    uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
    with sqlite3.connect(uri, uri=True) as conn:
        tables = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: {c[1]: c[2].upper() for c in conn.execute(f"PRAGMA table_info('{t}')")}
                for t in tables}


def db_strings(path: Path, table: str, column: str) -> set[str]:
    """The STRING_IDS values a table's id column names (none where the table is absent)."""
    if table not in db_schema(path):
        return set()
    uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
    with sqlite3.connect(uri, uri=True) as conn:
        return {v for (v,) in conn.execute(f"SELECT DISTINCT s.value FROM {table} x "
                                           f"JOIN STRING_IDS s ON s.id = x.{column}")}


def schema_extra(sim: dict[str, dict[str, str]], real: dict[str, dict[str, str]]) -> list[str]:
    """Every table, column or declared type of `sim` that `real` lacks, one line each."""
    found = []
    for table, columns in sim.items():
        if table not in real:
            found.append(f"table {table} absent from the real files")
            continue
        for column, kind in columns.items():
            if column not in real[table]:
                found.append(f"{table}.{column} absent from the real files")
            elif kind != real[table][column]:
                found.append(f"{table}.{column} is {kind}, real {real[table][column]}")
    return found


@pytest.fixture(scope="module")
def real_dbs(real: Path) -> list[Path]:
    folder = ascend_real(real) / "torch_npu_ddp8_db_level1"
    paths = sorted(folder.glob("rank*_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_*.db"))
    assert len(paths) == 2
    return paths


@pytest.fixture(scope="module")
def sim_dbs(tmp_path_factory) -> list[Path]:
    """The databases of the hand-built job (no memory profiled), then of `pp-memory`'s, each in
    a folder named after its job."""
    paths, base = [], tmp_path_factory.mktemp("simdb")
    for job, timeline in (("hand", hand_timeline()), (MEMORY_JOB, simulate(MEMORY_JOB))):
        folder = base / job
        folder.mkdir()
        files = materialize(write_ascend_db.iter_files(timeline))
        for path, data in files.items():
            if path.endswith(".db"):
                paths.append(folder / path.replace("/", "_"))
                paths[-1].write_bytes(data)
        assert not any(p.endswith(("trace_view.json", "communication.json", ".csv"))
                       for p in files)
    assert len(paths) == 8
    return paths


def union(schemas: list[dict[str, dict[str, str]]]) -> dict[str, dict[str, str]]:
    merged: dict[str, dict[str, str]] = defaultdict(dict)
    for one in schemas:
        for table, columns in one.items():
            merged[table] |= columns
    return dict(merged)


def test_ascend_db_tables_have_nothing_the_real_ones_lack(sim_dbs, real_dbs):
    real = union([db_schema(p) for p in real_dbs])
    for path in sim_dbs:
        sim = db_schema(path)
        assert schema_extra(sim, real) == []
        assert set(sim) >= ASCEND_DB_READ  # the comparison covered every table the parser reads


def test_memory_tables_are_written_when_the_job_profiles_memory(sim_dbs, real_dbs):
    """`pp-memory`'s databases hold MEMORY_RECORD with exactly the real table's columns and
    types (its text export writes memory_record.csv alone); the hand-built job profiles no
    memory and its databases hold no memory table, as a real export without profile_memory."""
    real = union([db_schema(p) for p in real_dbs])
    for path in sim_dbs:
        sim = db_schema(path)
        written = set(sim) & set(MEMORY_TABLES)
        if path.parent.name == MEMORY_JOB:
            assert written == {"MEMORY_RECORD"}
            assert sim["MEMORY_RECORD"] == real["MEMORY_RECORD"]
        else:
            assert written == set()


def test_the_db_structure_diff_catches_what_real_files_lack(sim_dbs, real_dbs):
    sim = db_schema(sim_dbs[0])
    sim["TASK"]["eventId"] = "INTEGER"  # what no real export has
    sim["COMMUNICATION_OP"]["count"] = "INTEGER"  # real: NUMERIC
    assert schema_extra(sim, union([db_schema(p) for p in real_dbs])) == [
        "TASK.eventId absent from the real files",
        "COMMUNICATION_OP.count is INTEGER, real NUMERIC"]


@pytest.mark.parametrize(("table", "column"), [
    ("TASK", "taskType"), ("COMMUNICATION_TASK_INFO", "taskType"),
    ("COMMUNICATION_OP", "opType"), ("COMMUNICATION_OP", "algType"), ("CANN_API", "name"),
    ("MEMORY_RECORD", "component")])
def test_ascend_db_strings_are_real_ones(sim_dbs, real_dbs, table, column, real):
    """The task types, HCCL op and task types, CANN API names and memory components the
    simulated databases use all occur in the real ones (kernel and op names are the text
    writer's, checked there; MindSpore's allocator components map to torch_npu's). The real
    databases hold only all-reduces: HCCL op types are also taken from the `Type` of the real
    pp2dp2 kernel_details.csv's COMMUNICATION rows (batchSendRecv, allGather, ...)."""
    known = set().union(*(db_strings(p, table, column) for p in real_dbs))
    if (table, column) == ("COMMUNICATION_OP", "opType"):
        folder = ascend_real(real) / "torch_npu_pp2dp2_level2_comm"
        for path in folder.glob("rank_*/*/kernel_details.csv"):
            rows = csv.DictReader(io.StringIO(path.read_text()))
            known |= {r["Type"] for r in rows if r["Accelerator Core"] == "COMMUNICATION"}
    sim = {DB_DOCUMENTED_STRINGS.get(v, v)
           for v in set().union(*(db_strings(p, table, column) for p in sim_dbs))}
    if (table, column) == ("CANN_API", "name"):
        sim = {re.sub(r"^(aclnn|hcom_)\w+$", r"\1*", s) for s in sim}
        known = {re.sub(r"^(aclnn|hcom_)\w+$", r"\1*", s) for s in known}
    assert sim and sim <= known


def test_ascend_db_times_are_ns_since_the_epoch(sim_dbs, real_dbs):
    for path in [*sim_dbs, *real_dbs]:
        uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
        with sqlite3.connect(uri, uri=True) as conn:
            low, high = conn.execute("SELECT MIN(startNs), MAX(endNs) FROM TASK").fetchone()
            assert 1.6e18 < low <= high < 1.9e18
            if "MEMORY_RECORD" in db_schema(path):
                first, last = conn.execute(
                    "SELECT MIN(timestamp), MAX(timestamp) FROM MEMORY_RECORD").fetchone()
                assert low - 1e9 < first <= last < high + 1e9  # the run's, in ns as well


# --- Kineto ------------------------------------------------------------------------------------

def real_kineto(real: Path) -> list[dict]:
    base = real / "kineto"
    paths = [base / "hta/nccl_parser_config/nccl_data.json.gz",
             base / "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
             base / "hta/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
             *sorted((base / "gloo_pp2_dp2").glob("rank*.json"))]
    assert all(p.exists() for p in paths) and len(paths) == 7
    return [json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes())
            for p in paths]


@pytest.fixture(scope="module")
def kineto_pair(real: Path) -> tuple[list[dict], list[dict]]:
    written = materialize(write_kineto.iter_files(hand_timeline()))
    sim = [json.loads(gzip.decompress(data)) for data in written.values()]
    return sim, real_kineto(real)


def kineto_category(event: dict) -> tuple:
    ph, cat, name = event["ph"], event.get("cat", ""), event.get("name", "")
    if ph in ("M", "i") or cat in ("cuda_runtime", "cuda_sync"):
        sub = name
    elif cat == "cpu_op":
        sub = "record_param_comms" if name == "record_param_comms" else "op"
    elif cat == "user_annotation":
        sub = "ProfilerStep" if name.startswith("ProfilerStep#") else "op"
    elif cat == "kernel":
        sub = "nccl" if name.startswith("nccl") else "compute"
    else:
        sub = ""
    return ph, cat, sub


def kineto_shapes(traces: list[dict]) -> Shapes:
    shapes = Shapes()
    for trace in traces:
        for event in trace["traceEvents"]:
            shapes.add(kineto_category(event), event)
    return shapes


def test_kineto_events_have_nothing_the_real_ones_lack(kineto_pair):
    sim, real = (kineto_shapes(traces) for traces in kineto_pair)
    assert extra(sim, real, allowed_args=KINETO_DOCUMENTED_ARGS) == []
    assert {c for c in sim.keys if c[1] in ("kernel", "cuda_sync", "cuda_runtime")} == {
        ("X", "kernel", "compute"), ("X", "kernel", "nccl"),
        ("X", "cuda_sync", "Stream Wait Event"), ("X", "cuda_runtime", "cudaLaunchKernel"),
        ("X", "cuda_runtime", "cudaLaunchKernelExC"), ("X", "cuda_runtime", "cudaEventRecord"),
        ("X", "cuda_runtime", "cudaStreamWaitEvent"), ("X", "cuda_runtime", "cudaMemcpyAsync")}


def test_kineto_names_and_threads_follow_real_patterns(kineto_pair):
    def names(traces: list[dict], cats: tuple[str, ...]) -> set[str]:
        return {pattern(e["name"]) for t in traces for e in t["traceEvents"]
                if e.get("cat") in cats and e["name"].startswith(("nccl:", "c10d::"))}

    def metadata(traces: list[dict]) -> set[str]:
        return {pattern(str(e["args"]["name"])) for t in traces for e in t["traceEvents"]
                if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}

    sim, real = kineto_pair
    assert names(sim, ("user_annotation",)) - names(real, ("user_annotation",)) == (
        KINETO_DOCUMENTED_NAMES)
    assert names(sim, ("cpu_op",)) <= names(real, ("cpu_op",))
    assert metadata(sim) == {"python", "stream N ", "thread N (python)"}
    assert metadata(sim) <= metadata(real)


def test_kineto_top_level_and_distributed_info_match_real(kineto_pair):
    sim, real = kineto_pair

    def keys(traces: list[dict], part: Callable[[dict], Iterable[dict]]) -> set[str]:
        return {k for t in traces for d in part(t) for k in d}

    parts = {
        "top": lambda t: [{k: v for k, v in t.items()}],
        "distributedInfo": lambda t: [t.get("distributedInfo", {})],
        "pg_config": lambda t: t.get("distributedInfo", {}).get("pg_config", []),
        "deviceProperties": lambda t: t.get("deviceProperties", []),
    }
    for part, get in parts.items():
        assert keys(sim, get) <= keys(real, get), part
        assert keys(sim, get), part


def test_kineto_timestamps_share_units_with_real(kineto_pair):
    sim, real = kineto_pair
    gloo = [t for t in real if t.get("distributedInfo", {}).get("backend") == "gloo"]
    assert len(gloo) == 4  # torch 2.13: relative ts with baseTimeNanoseconds, like the simulated
    for trace in [*sim, *gloo]:
        stamps = [e["ts"] for e in trace["traceEvents"] if isinstance(e.get("ts"), int | float)]
        assert min(stamps) >= 0 and max(stamps) < RELATIVE_TS_LIMIT_US
        assert 1.6e18 < trace["baseTimeNanoseconds"] < 1.9e18
        assert trace["displayTimeUnit"] == "ms"
