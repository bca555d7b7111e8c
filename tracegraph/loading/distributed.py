"""Past one machine: run the per-rank parsing and matching on a Dask cluster.

`dask_executor("local")` starts a `distributed.LocalCluster` (one single-threaded worker process
per CPU); any other value is the address of a running scheduler (`tcp://host:8786`). Workers must
see the bundle at the same path (a shared file system) unless it is a streamed archive, whose
members are sent to them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager

from parsers.base import TraceError


@contextmanager
def dask_executor(address: str, workers: int | None = None) -> Iterator[Executor]:
    """A concurrent.futures Executor backed by a Dask cluster, closed on exit."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:  # pragma: no cover - depends on the install
        raise TraceError("--dask needs the dask extra: pip install 'tracegraph[dask]'") from None
    cluster = None
    if address == "local":
        cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                               processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        try:
            client = Client(address, timeout=30)
        except OSError as error:
            raise TraceError(f"--dask {address}: cannot reach the scheduler ({error})") from None
    try:
        yield client.get_executor()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
