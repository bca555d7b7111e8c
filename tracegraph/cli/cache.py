"""`tracegraph cache info|clear`: where the cache folder lies, what it holds, emptying it."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from tracegraph.cli.common import cache_limit, friendly_errors, out, print_json
from tracegraph.cli.options import CacheDir, CacheSize

cache_app = typer.Typer(no_args_is_help=True, help=(
    "The cache of parsed ranks and analyses: a command run again on a bundle reads what the "
    "first run computed (keyed by the bytes of the ranks' files)."))


@cache_app.command("info")
@friendly_errors
def info_command(
    cache_dir: CacheDir = None,
    cache_size: CacheSize = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Where the cache folder lies, what it holds against its cap, and what interrupted runs
    left behind."""
    from tracegraph.loading.cachedir import default_cache_dir, entries, leftovers

    root = cache_dir or default_cache_dir()
    held, left = entries(root), leftovers(root)
    ranks = sum(1 for e in held if "-" not in e.name)
    facts = {"folder": str(root), "exists": root.is_dir(), "bytes": sum(e.size for e in held),
             "cap_bytes": cache_limit(), "entries": len(held), "parsed_ranks": ranks,
             "analyses": len(held) - ranks, "leftovers": len(left),
             "last_used": max((e.used for e in held), default=None),
             "least_recently_used": min((e.used for e in held), default=None)}
    if as_json:
        print_json(facts)
        return
    for line in _described(facts):
        out.print(line, highlight=False)


@cache_app.command("clear")
@friendly_errors
def clear_command(cache_dir: CacheDir = None) -> None:
    """Remove every entry of the cache folder (and what interrupted runs left); other files
    in it are left alone."""
    from tracegraph.loading.cachedir import clear, default_cache_dir

    root = cache_dir or default_cache_dir()
    removed, freed = clear(root)
    out.print(f"removed {removed} entries ({_size(freed)}) from {root}", highlight=False)


def _described(facts: dict) -> list[str]:
    lines = [f"cache folder: {facts['folder']}"
             + ("" if facts["exists"] else " (not made yet: nothing cached)"),
             f"holds {_size(facts['bytes'])} of its {_size(facts['cap_bytes'])} cap "
             f"(--cache-size, $TRACEGRAPH_CACHE_SIZE) in {facts['entries']} entries: "
             f"{facts['parsed_ranks']} parsed ranks, {facts['analyses']} analyses"]
    if facts["last_used"] is not None:
        lines.append(f"last used {_when(facts['last_used'])}; least recently used entry "
                     f"{_when(facts['least_recently_used'])} (evicted first)")
    if facts["leftovers"]:
        lines.append(f"{facts['leftovers']} folders left by interrupted runs (removed by the "
                     "next run that writes, or `tracegraph cache clear`)")
    return lines


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


