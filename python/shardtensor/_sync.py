"""PhysicsNeMo's ``sync_module_over_mesh``: a module's plain parameters and buffers made equal
over a mesh, from one rank's copy.

A model with plain weights beside ShardTensor activations (PhysicsNeMo's recipe) needs the same
weights on every rank of the domain mesh: torch's DDP broadcasts only over its own group, and
FSDP2 not at all. ShardTensor and DTensor parameters are skipped (their layout owns their
values). Errors follow PhysicsNeMo's types: ValueError for the arguments (a mesh of several dims,
a source rank outside it), RuntimeError for the module's state (ranks whose modules differ,
meta tensors, tensors on another device than the mesh's, state that is all distributed, a
module already wrapped by fully_shard), raised on every rank before any value moves.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from . import _C


def _is_distributed(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return _C.is_shard_tensor(t) or isinstance(t, DTensor)


def _plain_state(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    named = [*module.named_parameters(), *module.named_buffers()]
    return [(name, t) for name, t in named if not _is_distributed(t)]


def _problem(module: torch.nn.Module, named, mesh) -> str | None:
    """What makes this rank's plain state impossible to broadcast, or None."""
    for name, t in named:
        if t.is_meta:
            return f"'{name}' is a meta tensor; materialise it first (Module.to_empty and an initialisation)"
        if t.device.type != mesh.device_type:
            return f"'{name}' is on {t.device.type}, but the mesh's device type is {mesh.device_type}"
    if not named and any(True for _ in (*module.parameters(), *module.buffers())):
        return ("the module's parameters and buffers are all distributed (ShardTensor or DTensor), so none is plain; "
                "their layouts own their values: call this before distributing replicated state")
    return None


def _describe(named) -> list[tuple[str, tuple[int, ...], str]]:
    return [(name, tuple(t.shape), str(t.dtype)) for name, t in named]


def _checksum(t: torch.Tensor) -> torch.Tensor:
    values = t.detach().double().flatten()
    finite = torch.where(torch.isfinite(values), values, torch.zeros_like(values))
    return torch.stack((finite.sum(), finite.abs().sum(), torch.isnan(values).sum().double()))


def sync_module_over_mesh(module: torch.nn.Module, mesh, src_mesh_rank: int = 0, verify: bool = False) -> None:
    """Broadcasts every plain parameter and buffer of ``module`` over the 1-d ``mesh`` from the
    rank at position ``src_mesh_rank`` in it, in place (one coalesced broadcast, as DDP's at
    construction). Ranks whose modules differ in names, shapes or dtypes, or whose state cannot
    be broadcast (see _problem), all raise RuntimeError before any value moves. ``verify=True``
    also compares checksums of the values afterwards."""
    if mesh.ndim != 1:
        raise ValueError(f"sync_module_over_mesh: the mesh has {mesh.ndim} dims {mesh.mesh_dim_names or ''}; "
                         "pass the axis to synchronise over, e.g. mesh['domain']")
    size = mesh.size()
    if isinstance(src_mesh_rank, bool) or not isinstance(src_mesh_rank, int) or not 0 <= src_mesh_rank < size:
        raise ValueError(f"sync_module_over_mesh: src_mesh_rank={src_mesh_rank!r}; allowed are 0 to {size - 1}")
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module, FSDPModule) or type(module).__name__.startswith("FSDP"):
        raise RuntimeError("sync_module_over_mesh must run before fully_shard, while the module's state is still plain")
    named = _plain_state(module)
    group = mesh.get_group()
    # Every rank's state described and hashed, with what stops it being broadcast: a problem on
    # one rank is an error everywhere, not a broadcast of mismatched buffers or a hang.
    mine = hashlib.sha256(repr(_describe(named)).encode()).hexdigest()
    everyone = [None] * size
    dist.all_gather_object(everyone, (mine, _describe(named), _problem(module, named, mesh)), group=group)
    problems = [(r, p) for r, (_, _, p) in enumerate(everyone) if p is not None]
    if problems:
        rank, problem = problems[0]
        raise RuntimeError(f"sync_module_over_mesh: on mesh rank {rank}, {problem}")
    if any(h != everyone[src_mesh_rank][0] for h, _, _ in everyone):
        rank = next(r for r, (h, _, _) in enumerate(everyone) if h != everyone[src_mesh_rank][0])
        theirs, source = dict((n, (s, d)) for n, s, d in everyone[rank][1]), everyone[src_mesh_rank][1]
        first = next(((n, (s, d), theirs.get(n)) for n, s, d in source if theirs.get(n) != (s, d)), None)
        detail = (f"'{first[0]}' is {first[1]} on mesh rank {src_mesh_rank} and {first[2]} on mesh rank {rank}" if first
                  else f"mesh rank {rank} has state that mesh rank {src_mesh_rank} lacks")
        raise RuntimeError(f"sync_module_over_mesh: the ranks' modules differ (names, shapes or dtypes of their plain "
                         f"parameters and buffers): {detail}")
    if not named:
        return
    tensors = [t.detach() for _, t in named]
    with torch.no_grad():
        if hasattr(dist, "_broadcast_coalesced"):
            dist._broadcast_coalesced(group, tensors, 250 * 1024 * 1024, src_mesh_rank)
        else:  # pragma: no cover - every torch this package supports has it
            source = dist.get_global_rank(group, src_mesh_rank)
            for t in tensors:
                dist.broadcast(t, src=source, group=group)
    if verify:
        sums = torch.stack([_checksum(t) for t in tensors])
        low, high = sums.clone(), sums.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
        differs = [name for (name, _), lo, hi in zip(named, low, high) if not torch.equal(lo, hi)]
        if differs:
            raise RuntimeError(f"sync_module_over_mesh: after the broadcast, values still differ over the mesh for {differs}")
