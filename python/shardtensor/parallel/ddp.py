"""PhysicsNeMo's recipe (plain weights, activations split over "domain", torch's DDP over "dp")
with one gradient sum instead of two.

By default a plain weight's gradient is summed over "domain" by shardtensor as soon as it is
ready, and DDP then averages it over "dp": two sums, the first one per parameter. After
``sum_gradients_with_ddp(ddp, mesh)`` each rank hands DDP its own term of the domain sum with no
message, and DDP's buckets are all-reduced once over every rank of ``mesh`` and divided by the
"dp" size: the same gradients, in one bucketed sum that DDP overlaps with the backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _C


class MeshGradientSum:
    """The comm hook's state: the group of every rank of the mesh, the data-parallel size, and
    ``bytes``, what this rank has all-reduced so far (the buckets' payloads)."""

    def __init__(self, group, dp: int):
        self.group, self.dp, self.bytes = group, dp, 0


def _mesh_sum_hook(state: MeshGradientSum, bucket):
    buffer = bucket.buffer()
    state.bytes += buffer.numel() * buffer.element_size()
    buffer.div_(state.dp)
    work = dist.all_reduce(buffer, group=state.group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _group_of_all_ranks(mesh):
    ranks = sorted(mesh.mesh.flatten().tolist())
    if ranks == list(range(dist.get_world_size())):
        return dist.group.WORLD
    return dist.new_group(ranks)  # collective over the world: every rank calls sum_gradients_with_ddp


def sum_gradients_with_ddp(ddp: torch.nn.parallel.DistributedDataParallel, device_mesh,
                           dp_dim: str | int = "dp") -> MeshGradientSum:
    """Makes ``ddp`` sum its module's gradients over every rank of ``device_mesh`` in one bucketed
    all-reduce (divided by the size of ``dp_dim``), and shardtensor hand it each rank's term of the
    sum over the other dims (where the activations are split) instead of summing them first.

    ``ddp`` wraps the model with ``process_group=device_mesh[dp_dim].get_group()``; call this on
    every rank, after wrapping and before the first backward. Gradients, and so the parameters
    after each step, equal those without it (to rounding); until DDP's sum has run, a ``.grad``
    holds this rank's term. It replaces DDP's comm hook (one per DDP module). Returns the hook's
    state, whose ``bytes`` counts what it has all-reduced."""
    if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"sum_gradients_with_ddp: expected a torch.nn.parallel.DistributedDataParallel module, got "
                        f"{type(ddp).__name__}")
    if device_mesh.ndim < 2:
        raise ValueError(f"sum_gradients_with_ddp: expected a mesh with a data-parallel dim and the dims that split the "
                         f"activations (e.g. ('dp', 'domain')), got the {device_mesh.ndim}-D {device_mesh}")
    dp = device_mesh.size(dp_dim)
    if ddp.process_group.size() != dp:
        raise ValueError(f"sum_gradients_with_ddp: DDP's process group has {ddp.process_group.size()} ranks but the "
                         f"mesh's {dp_dim!r} dim has {dp}; wrap the model with process_group=mesh[{dp_dim!r}].get_group()")
    domain_ranks = device_mesh.size() // dp
    for param in ddp.module.parameters():
        if param.requires_grad:
            if _C.is_shard_tensor(param):
                raise ValueError("sum_gradients_with_ddp: the model has a ShardTensor parameter; it is for plain "
                                 "parameters beside ShardTensor activations (PhysicsNeMo's recipe)")
            _C.hand_on_gradient_terms(param, domain_ranks)
    state = MeshGradientSum(_group_of_all_ranks(device_mesh), dp)
    ddp.register_comm_hook(state, _mesh_sum_hook)
    return state
