"""PhysicsNeMo's ``sync_module_over_mesh``: a module's plain parameters and buffers made equal
over a mesh, from one rank's copy.

A model with plain weights beside ShardTensor activations (PhysicsNeMo's recipe) needs the same
weights on every rank of the domain mesh: torch's DDP broadcasts only over its own group, and
FSDP2 not at all. ShardTensor parameters are skipped (their layout owns their values).
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from . import _C


def _plain_state(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    named = [*module.named_parameters(), *module.named_buffers()]
    return [(name, t) for name, t in named if not _C.is_shard_tensor(t)]


def _describe(named) -> list[tuple[str, tuple[int, ...], str]]:
    return [(name, tuple(t.shape), str(t.dtype)) for name, t in named]


def _checksum(t: torch.Tensor) -> torch.Tensor:
    values = t.detach().double().flatten()
    finite = torch.where(torch.isfinite(values), values, torch.zeros_like(values))
    return torch.stack((finite.sum(), finite.abs().sum(), torch.isnan(values).sum().double()))


def sync_module_over_mesh(module: torch.nn.Module, mesh, src_mesh_rank: int = 0, verify: bool = False) -> None:
    """Broadcasts every plain parameter and buffer of ``module`` over the 1-d ``mesh`` from the
    rank at position ``src_mesh_rank`` in it, in place (one coalesced broadcast, as DDP's at
    construction). Ranks whose modules differ in names, shapes or dtypes all raise ValueError
    before any value moves. ``verify=True`` also compares checksums of the values afterwards."""
    if mesh.ndim != 1:
        raise ValueError(f"sync_module_over_mesh: the mesh has {mesh.ndim} dims {mesh.mesh_dim_names or ''}; "
                         "pass the axis to synchronise over, e.g. mesh['domain']")
    size = mesh.size()
    if isinstance(src_mesh_rank, bool) or not isinstance(src_mesh_rank, int) or not 0 <= src_mesh_rank < size:
        raise ValueError(f"sync_module_over_mesh: src_mesh_rank={src_mesh_rank!r}; allowed are 0 to {size - 1}")
    if type(module).__name__.startswith("FSDP"):
        raise RuntimeError("sync_module_over_mesh must run before fully_shard, while the module's state is still plain")
    named = _plain_state(module)
    group = mesh.get_group()
    # Every rank's state described and hashed: a disagreement is an error everywhere, not a
    # broadcast of mismatched buffers.
    mine = hashlib.sha256(repr(_describe(named)).encode()).hexdigest()
    everyone = [None] * size
    dist.all_gather_object(everyone, (mine, _describe(named)), group=group)
    if any(h != everyone[src_mesh_rank][0] for h, _ in everyone):
        rank = next(r for r, (h, _) in enumerate(everyone) if h != everyone[src_mesh_rank][0])
        theirs, source = dict((n, (s, d)) for n, s, d in everyone[rank][1]), everyone[src_mesh_rank][1]
        first = next(((n, (s, d), theirs.get(n)) for n, s, d in source if theirs.get(n) != (s, d)), None)
        detail = (f"'{first[0]}' is {first[1]} on mesh rank {src_mesh_rank} and {first[2]} on mesh rank {rank}" if first
                  else f"mesh rank {rank} has state that mesh rank {src_mesh_rank} lacks")
        raise ValueError(f"sync_module_over_mesh: the ranks' modules differ (names, shapes or dtypes of their plain "
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
