"""Faults as users' machines have them, each in a fresh `python -m tracegraph`: a cache that
cannot be written is one warning and an uncached analysis; a killed or interrupted run leaves no
parser process and nothing a later run keeps; resource limits and a closed output are one error
line and exit 2."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import REAL, REPO

RANK = REAL / "kineto" / "gloo_pp2_dp2" / "rank0.json"
HTA_RANK = REAL / "kineto" / "hta" / "negative_queue_length_values_check" / "rank0.json.gz"
WITHOUT_CACHING = "going on without caching"
_PR_CAPBSET_DROP = 24
_OVERRIDES = (1, 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: root reads and writes anything


def tracegraph(*args: str, env: dict[str, str] | None = None,
               setup: Callable[[], None] | None = None, prefix: tuple[str, ...] = (),
               **popen: object) -> subprocess.CompletedProcess:
    """`python -m tracegraph ARGS` as a user runs it; `setup` runs in the child before exec."""
    return subprocess.run([*prefix, sys.executable, "-m", "tracegraph", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=env or os.environ.copy(), preexec_fn=setup, **popen)


def _as_a_user() -> None:
    """Permissions apply to this process as to any user's (root: drop the override)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in _OVERRIDES:
            assert libc.prctl(_PR_CAPBSET_DROP, cap) == 0, os.strerror(ctypes.get_errno())


def _file_size_limit() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


@pytest.fixture(scope="module")
def uncached() -> subprocess.CompletedProcess:
    run = tracegraph("analyze", str(RANK), "--json", "--no-cache")
    assert run.returncode == 0, run.stderr
    return run


def _errors(stderr: str) -> list[str]:
    """The lines of stderr that are not the bundle's warnings."""
    return [line for line in stderr.splitlines() if not line.startswith("warning:")]


def _cache_lines(run: subprocess.CompletedProcess) -> list[str]:
    return [line for line in run.stderr.splitlines() if "cache" in line]


# --- the cache never stops a run ----------------------------------------------------------------
def _fault(tmp_path: Path, how: str) -> tuple[list[str], dict[str, str], Callable | None]:
    """Options, environment and child set-up that give the cache fault `how`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRACEGRAPH_CACHE_DIR", "XDG_CACHE_HOME")}
    cache = tmp_path / "cache"
    if how == "555 folder":
        cache.mkdir(mode=0o555)
        return ["--cache-dir", str(cache)], env, _as_a_user
    if how == "a file":
        cache.write_text("mine")
    elif how == "a dangling link":
        cache.symlink_to(tmp_path / "nowhere")
    elif how == "XDG_CACHE_HOME unusable":
        (tmp_path / "f").write_text("")
        return [], env | {"XDG_CACHE_HOME": str(tmp_path / "f" / "cache")}, None
    elif how == "HOME unusable":
        return [], env | {"HOME": "/dev/null"}, None
    elif how == "file size limit":
        return ["--cache-dir", str(cache)], env, _file_size_limit
    return ["--cache-dir", str(cache)], env, None


@pytest.mark.parametrize("how", ["555 folder", "a file", "a dangling link", "file size limit",
                                 "XDG_CACHE_HOME unusable", "HOME unusable"])
def test_a_cache_fault_is_one_warning_and_an_uncached_analysis(
        tmp_path: Path, how: str, uncached: subprocess.CompletedProcess) -> None:
    options, env, setup = _fault(tmp_path, how)
    before = sorted({p.name for p in tmp_path.iterdir()} - {"cache"})
    run = tracegraph("analyze", str(RANK), "--json", *options, env=env, setup=setup)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == json.loads(uncached.stdout)
    [line] = _cache_lines(run)
    assert line.startswith("warning: cache ") and line.endswith(WITHOUT_CACHING), line
    assert run.stderr.count("\n") == uncached.stderr.count("\n") + 1
    assert sorted({p.name for p in tmp_path.iterdir()} - {"cache"}) == before
    cache = tmp_path / "cache"  # made at most, with its tag, but no entry, no half of one
    assert cache.is_symlink() or not cache.is_dir() or [p.name for p in cache.iterdir()] in (
        [], ["CACHEDIR.TAG"])


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs in a mount namespace of its own")
def test_a_full_file_system_is_one_warning(tmp_path: Path,
                                           uncached: subprocess.CompletedProcess) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    mount = ("unshare", "--mount", "sh", "-c",
             'mount -t tmpfs -o size=128k tmpfs "$0" && head -c 100000 /dev/zero > "$0/fill" '
             '&& exec "$@"', str(cache))
    run = tracegraph("analyze", str(RANK), "--json", "--cache-dir", str(cache), prefix=mount)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == json.loads(uncached.stdout)
    [line] = _cache_lines(run)
    assert "No space left on device" in line and line.endswith(WITHOUT_CACHING), line


def test_a_read_only_cache_that_holds_everything_serves_it_silently(
        tmp_path: Path, uncached: subprocess.CompletedProcess) -> None:
    cache = tmp_path / "cache"
    first = tracegraph("analyze", str(RANK), "--json", "--cache-dir", str(cache))
    for folder in [cache, *cache.iterdir()]:
        folder.chmod(0o555 if folder.is_dir() else 0o444)
    warm = tracegraph("analyze", str(RANK), "--json", "--cache-dir", str(cache),
                      setup=_as_a_user)
    assert first.returncode == warm.returncode == 0, warm.stderr
    assert warm.stdout == first.stdout and warm.stderr == uncached.stderr  # not a word more


# --- killed, interrupted ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slow_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks of a real 26 MB Kineto trace: seconds to parse, long enough to stop."""
    import gzip

    folder = tmp_path_factory.mktemp("slow")
    text = gzip.decompress(HTA_RANK.read_bytes())
    for rank in range(2):
        stated = f'"rank": {rank}, "world_size": 2'.encode()
        (folder / f"rank{rank}.json").write_bytes(
            text.replace(b'"rank": 0, "world_size": 16', stated, 1))
    return folder


def _started(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tracegraph", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group, as a terminal's job


def _until(condition: Callable[[], bool], process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "never got there"
        time.sleep(0.02)


def _parsing(cache: Path, process: subprocess.Popen) -> Callable[[], bool]:
    """Whether the ranks are being parsed: a hand-off folder and parser processes."""
    return lambda: bool(list(cache.glob(".handoff-*"))) and bool(
        psutil.Process(process.pid).children())


def test_a_killed_run_leaves_no_parser_and_the_next_run_no_hand_off(slow_bundle: Path,
                                                                    tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    run = _started(["analyze", str(slow_bundle), "--jobs", "2", "--cache-dir", str(cache)])
    _until(_parsing(cache, run), run)
    parsers = psutil.Process(run.pid).children()
    run.kill()
    run.communicate()
    _, alive = psutil.wait_procs(parsers, timeout=15)
    assert not alive  # they died with their parent
    assert list(cache.glob(".handoff-*"))  # what SIGKILL left
    later = tracegraph("analyze", str(RANK), "--json", "--cache-dir", str(cache))
    assert later.returncode == 0, later.stderr
    assert not list(cache.glob(".handoff-*")) and not list(cache.glob(".tmp-*"))


@pytest.mark.parametrize("when", ["start-up", "parsing", "analysing"])
def test_ctrl_c_ends_the_run_with_one_line_and_130(slow_bundle: Path, tmp_path: Path,
                                                   when: str) -> None:
    cache = tmp_path / "cache"
    run = _started(["analyze", str(slow_bundle), "--jobs", "2", "--cache-dir", str(cache)])
    if when == "start-up":
        time.sleep(0.3)  # importing (the interpreter's own first 0.1 s aside)
    elif when == "parsing":
        _until(_parsing(cache, run), run)
    else:  # both ranks stored, the hand-off folder gone: the analysis runs
        _until(lambda: len(list(cache.glob("????????????????????????????????"))) == 2
               and not list(cache.glob(".handoff-*")), run)
    group = [run, *psutil.Process(run.pid).children(recursive=True)]
    os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 130, stderr
    assert stderr.splitlines()[-1:] == ["error: interrupted (SIGINT): stopped"], stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert _errors(stderr) == ["error: interrupted (SIGINT): stopped"]
    _, alive = psutil.wait_procs(group[1:], timeout=15)
    assert not alive and not list(cache.glob(".handoff-*")) and not list(cache.glob(".tmp-*"))


# --- resources ----------------------------------------------------------------------------------
def _address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))


def test_half_a_gigabyte_of_address_space_is_one_error_line(tmp_path: Path) -> None:
    run = tracegraph("analyze", str(RANK), "--json", "--no-cache", setup=_address_space)
    assert run.returncode == 2, run.stderr
    [line] = _errors(run.stderr)  # the bundle's warnings may come first
    assert line.startswith("error: out of memory: the address space is limited to 512 MiB"), line


def test_a_closed_stdout_is_one_error_line() -> None:
    run = tracegraph("analyze", str(RANK), "--json", "--no-cache", stdout=None,
                     setup=lambda: os.close(1))
    assert run.returncode == 2
    assert _errors(run.stderr) == [
        "error: standard output is closed (started with >&-): nothing can be printed; "
        "redirect it to a file or /dev/null"]


@pytest.mark.parametrize("args", [["--json"], []])
def test_a_reader_that_goes_away_is_one_error_line(args: list[str]) -> None:
    run = subprocess.Popen([sys.executable, "-m", "tracegraph", "analyze", str(RANK), *args,
                            "--no-cache"], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    run.stdout.close()  # `| head` gone before the first line
    stderr = run.stderr.read()
    assert run.wait(timeout=300) == 2
    assert _errors(stderr) == [
        "error: standard output closed before everything was written (broken pipe)"]


@pytest.mark.parametrize("command", [["analyze", str(RANK)], ["diff", str(RANK), str(RANK)],
                                     ["whatif", str(RANK)], ["report", str(RANK)]])
def test_a_reader_that_goes_away_with_stderr_on_its_pipe_is_exit_2(command: list[str]) -> None:
    """`2>&1 | head`: the error line (or a usage error's: `report` without -o) has nowhere to
    go; the exit code still says it."""
    run = subprocess.Popen([sys.executable, "-m", "tracegraph", *command, "--no-cache"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    run.stdout.close()  # the reader gone before the first line, stderr's and stdout's alike
    assert run.wait(timeout=300) == 2


def test_outputs_named_in_bytes_that_are_no_utf8(tmp_path: Path) -> None:
    name = os.fsdecode(b"out\xff")
    run = tracegraph("export", str(RANK), "--parquet", str(tmp_path / name), "--no-cache")
    assert run.returncode == 0, run.stderr
    assert sorted(os.listdir(os.fsencode(tmp_path / name))) == [
        b"events.parquet", b"groups.parquet", b"memory.parquet", b"ranks.parquet"]
    cached = tracegraph("analyze", str(RANK), "--json", "--cache-dir", str(tmp_path / name))
    assert cached.returncode == 0 and "cache" not in cached.stderr, cached.stderr
