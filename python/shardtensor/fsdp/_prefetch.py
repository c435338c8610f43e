"""Prefetch: a fully sharded module's all-gathers started before its forward (or backward)
needs them, so that they run while the current module computes (FSDP2's
``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``, and
``unshard(async_op=True)``).

Collectives block the thread that runs them, so a prefetched gather runs on one background
thread per process (the gather stream), in the order the main thread started them, which is the
same on every rank. Running it on the data-parallel process groups the main thread also uses
would let the two threads reach one group in different orders on different ranks; so the stream
gathers over twin meshes: the same ranks and dims, over process groups of their own, made once
per mesh when prefetch is first configured (a collective call, as every fully_shard call is) and
used by the stream alone. The main thread's collectives and the stream's then never share a
group, and each group sees one thread's collectives, in program order.

A prefetched gather is taken by the gather it stands in for only if the sharded parameter has
not changed since it started (its local tensor's version counter): an optimizer step between
the two makes the gather run again, never hands out the old values. An error on the stream (a
peer that died or timed out) is raised by the main thread where it takes the gather.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import torch
import torch.distributed as dist

from .. import _C
from .._mesh import DeviceMesh, collective_timeout_s, mesh_of_dims


class PrefetchStatistics:
    """What the stream did, for tests and bench/fsdp_bench.py: how many gathers started, how many
    it ran and for how long, and how long the main thread then waited to take them. The overlap is
    1 - waited_s / gather_s: the share of the gathers' time the main thread computed through."""

    def __init__(self):
        self.started = 0  # counted where they start (the main thread), so tests may compare it
        self.gathers = 0
        self.gather_s = 0.0
        self.taken = 0
        self.waited_s = 0.0


STATISTICS = PrefetchStatistics()


class _GatherStream:
    """One daemon thread running submitted functions in submission order, each returning a
    Future. The functions run without autograd, and count their collectives into the
    CommDebugMode that was active where they were submitted."""

    def __init__(self):
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()
        self._in_flight: list[Future] = []

    def submit(self, fn) -> Future:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shardtensor-fsdp-prefetch", daemon=True)
                self._thread.start()
            future = Future()
            self._in_flight.append(future)
        STATISTICS.started += 1
        self._tasks.put((fn, future, _C.CommDebugHandoff()))
        return future

    def drain(self, timeout: float | None = None) -> None:
        """Waits for every gather submitted so far (their errors stay with their futures)."""
        with self._lock:
            pending = list(self._in_flight)
        for future in pending:
            try:
                future.exception(timeout=timeout)
            except TimeoutError:
                return

    def _run(self):
        while True:
            fn, future, counts = self._tasks.get()
            result = None
            counts.enter()
            began = time.perf_counter()
            try:
                with torch.no_grad():
                    result = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the thread that takes the gather
                future.set_exception(e)
            else:
                future.set_result(result)
            finally:
                counts.exit()
                STATISTICS.gathers += 1
                STATISTICS.gather_s += time.perf_counter() - began
                with self._lock:  # a result nobody takes any more is freed with its future
                    self._in_flight.remove(future)
                del fn, future, result


STREAM = _GatherStream()

# The FSDPParams with a prefetched gather not yet taken: what the end of a forward or backward
# lets go of (a module prefetched for but not run), so that no gathered parameter outlives the
# pass it was for.
PENDING: set = set()


def discard_pending() -> None:
    for param in list(PENDING):
        param.discard_prefetch()

# C++ mesh of a root mesh -> its twin over process groups of its own.
_TWIN_ROOTS: dict = {}


def _twin_root(root: DeviceMesh) -> DeviceMesh:
    """`root`'s layout and dim names over new process groups, one per slice of every dim, made by
    every rank of the world in one order (as torch.distributed.new_group requires)."""
    found = _TWIN_ROOTS.get(root._cpp)
    if found is not None:
        return found
    layout = root.mesh
    me = dist.get_rank()
    groups = []
    for d in range(layout.dim()):
        mine = None
        for ranks in layout.movedim(d, -1).reshape(-1, layout.shape[d]).tolist():
            group = dist.new_group(ranks=ranks)
            if me in ranks:
                mine = group
        groups.append(mine)
    ranks = layout.flatten().tolist()
    mesh_group = None
    if layout.dim() > 1:
        whole = dist.new_group(ranks=ranks)
        mesh_group = whole if me in ranks else None
    cpp = _C.DeviceMesh.from_process_groups(list(layout.shape), ranks, groups, list(root.mesh_dim_names or ()),
                                            root.device_type, root._cpp.timeout_s, mesh_group)
    twin = DeviceMesh._wrap(cpp, groups=groups, private=True)
    _TWIN_ROOTS[root._cpp] = twin
    return twin


def twin_mesh(root: DeviceMesh, dims) -> DeviceMesh:
    """The mesh of `root`'s dims `dims` (as mesh_of_dims) over the twin's process groups."""
    return mesh_of_dims(_twin_root(root), dims)


def shutdown() -> None:
    """At exit (shardtensor's shutdown, before it releases the communicators): waits, at most
    the collective timeout, for gathers still on the stream, and lets go of the twin meshes."""
    STREAM.drain(timeout=collective_timeout_s())
    discard_pending()
    _TWIN_ROOTS.clear()
