"""One parameter under fully_shard: the sharded ShardTensor the module holds between steps (what
optimizers step and state dicts save), and the autograd function that all-gathers it for a
forward and reduce-scatters its gradient.

The sharded parameter is laid out on a mesh whose dims are the parameter's own (tensor
parallelism's, if any) followed by the data-parallel ones, with ``Shard(0)`` on the last: the
earlier mesh dim splits a tensor dim first (nested sharding, docs/placements.md), so each rank's
data-parallel piece is a part of its tensor-parallel piece (what DTensor needs ``_StridedShard``
for), any size, uneven, no padding. An all-gather over the data-parallel dims gives back the
tensor-parallel piece; the gradient, one term per data-parallel rank, is ``Partial("avg")`` over
those dims and reduce-scatters back to the sharded layout.
"""

from __future__ import annotations

import time
import weakref

import torch
from torch import nn

from .. import _C
from .._mesh import DeviceMesh, mesh_of_dims, root_and_dims
from .._placements import Partial, Replicate, Shard
from .._tensor import from_local
from . import _prefetch


def data_parallel_placements(dp_mesh: DeviceMesh) -> list:
    """FSDP2's: Shard(0) over a 1-D mesh; HSDP's (Replicate(), Shard(0)) over a 2-D one."""
    return [Replicate()] * (dp_mesh.ndim - 1) + [Shard(0)]


class FSDPParam:
    """A parameter's sharded form and how to gather it, for one fully_shard call.

    owners: the (module, attribute name) pairs that hold it (several for tied weights)."""

    def __init__(self, fqn: str, param: nn.Parameter, owners, dp_mesh: DeviceMesh, mp_policy):
        self.fqn, self.owners, self.mp_policy = fqn, owners, mp_policy
        self.requires_gradient_sync = True
        self.pending_grad = None  # this rank's unreduced gradient while sync is off
        self._regathered = None  # gathered again for the backward (reshard_after_forward)
        self.last_unsharded = lambda: None
        self.in_traced_forward = False  # a forward of its module is being traced (_module.py)
        self.twin = None  # where the prefetch stream gathers it (_prefetch.py), once configured
        self._prefetched = None  # (Future of the gathered local piece, the sharded piece's versions)
        self.saved_for_backward = False  # the last forward saved it for backward as a note (_reshard.py)
        self.is_shard_tensor = _C.is_shard_tensor(param)
        dp_placements = data_parallel_placements(dp_mesh)
        dp_root, dp_dims = root_and_dims(dp_mesh)
        if self.is_shard_tensor:
            self.unsharded_mesh = param.device_mesh
            self.unsharded_placements = tuple(param.placements)
            self.unsharded_sizes = param.shard_sizes()
            root, dims = root_and_dims(self.unsharded_mesh)
            if root != dp_root:
                raise ValueError(
                    f"fully_shard: parameter {fqn!r} is a ShardTensor on {self.unsharded_mesh}, and the data-parallel "
                    f"mesh {dp_mesh} is not a dim of the same mesh. Build one mesh with both dims "
                    f"(init_device_mesh(..., mesh_dim_names=('dp', 'tp'))), and pass mesh['tp'] to parallelize_module "
                    f"and mesh['dp'] to fully_shard")
            if set(dims) & set(dp_dims):
                raise ValueError(
                    f"fully_shard: parameter {fqn!r} is already laid out over the data-parallel mesh dims "
                    f"{[dp_root.mesh_dim_names[d] if dp_root.mesh_dim_names else d for d in dp_dims]} "
                    f"(placements {list(self.unsharded_placements)} on {self.unsharded_mesh}); fully_shard shards "
                    f"parameters over mesh dims they are not laid out on")
            self.mesh_root, self.mesh_dims = root, dims + dp_dims
            self.mesh = mesh_of_dims(root, self.mesh_dims)
            lead = list(self.unsharded_placements)
        else:
            self.unsharded_mesh, self.unsharded_placements, self.unsharded_sizes = None, (), {}
            self.mesh_root, self.mesh_dims = dp_root, dp_dims
            self.mesh, lead = dp_mesh, []
        n = len(dp_placements)
        self.placements = tuple(lead + dp_placements)
        self.gathered_placements = tuple(lead + [Replicate()] * n)
        self.grad_placements = tuple(lead + [Partial("avg")] * n)
        self.shape = tuple(param.shape)
        with torch.no_grad():
            local = param.detach().to_local() if self.is_shard_tensor else param.detach()
            # Every rank holds its tensor-parallel piece whole: each keeps its part (no message).
            whole = self._on_mesh(local, self.gathered_placements, self.unsharded_sizes)
            sharded = whole.redistribute(self.mesh, self.placements)
        self.sharded_sizes = sharded.shard_sizes()
        self.sharded = nn.Parameter(sharded, requires_grad=param.requires_grad)
        self.sharded._fsdp_param = self

    def _on_mesh(self, local: torch.Tensor, placements, sizes, mesh=None):
        # The sizes follow from the layout every rank shares: no agreement all-gather.
        return from_local(local, self.mesh if mesh is None else mesh, placements, shape=self.shape, sharding_shapes=sizes,
                          _trusted_sizes=True)

    # ---- the forward's parameter -------------------------------------------------------
    def unsharded(self) -> torch.Tensor:
        """The parameter as the module computes with it (plain, or a ShardTensor laid out as
        tensor parallelism left it), in the policy's param_dtype; differentiable."""
        self.saved_for_backward = False
        out = _AllGather.apply(self.sharded, self)
        self.last_unsharded = weakref.ref(out)  # whether it is still held (tests, bench/fsdp_bench.py)
        return out

    def regathered(self) -> torch.Tensor:
        """The unsharded parameter gathered again for the backward, once until its gradient is
        reduced (reshard_after_forward)."""
        if self._regathered is None:
            with torch.no_grad():
                self._regathered = self.gather(self.sharded)
        return self._regathered

    def needs_regather(self) -> bool:
        """Whether the running backward will gather it again and has not started to."""
        return self.saved_for_backward and self._regathered is None and self._prefetched is None

    # ---- prefetch (_prefetch.py) ---------------------------------------------------------
    def _versions(self):
        return self.sharded._version, self.sharded._local_tensor._version

    def start_gather(self) -> None:
        """Starts gathering the parameter on the prefetch stream, for the next gather() of it to
        take; nothing if one is already under way."""
        if self._prefetched is not None:
            return
        local, dtype, twin = self.sharded._local_tensor, self.mp_policy.param_dtype, self.twin

        def gather_on_twin():
            piece = local.to(dtype) if dtype is not None and dtype != local.dtype else local
            sharded = self._on_mesh(piece, self.placements, self.sharded_sizes, twin)
            gathered = sharded.redistribute(twin, self.gathered_placements).to_local()
            return gathered.clone() if gathered.data_ptr() == local.data_ptr() else gathered

        self._prefetched = (_prefetch.STREAM.submit(gather_on_twin), self._versions())
        _prefetch.PENDING.add(self)

    def discard_prefetch(self) -> None:
        self._prefetched = None
        _prefetch.PENDING.discard(self)

    def _take_prefetched(self):
        """The prefetched local piece, or None where none was started or the parameter changed
        since (an optimizer step): then the caller gathers it now."""
        if self._prefetched is None:
            return None
        future, versions = self._prefetched
        self.discard_prefetch()
        if versions != self._versions():
            return None
        began = time.perf_counter()
        try:
            return future.result()  # raises the stream's error (a peer that failed) here
        finally:
            _prefetch.STATISTICS.taken += 1
            _prefetch.STATISTICS.waited_s += time.perf_counter() - began

    def gathered_in_graph(self) -> torch.Tensor:
        """The unsharded parameter as a forward that dynamo traces computes it (SimpleFSDP's
        form): the all-gather, and in the backward the reduce-scatter of the gradient terms
        (``Partial("avg")`` over the data-parallel dims), are operators of the graph, which
        Inductor can bucket and overlap with compute. Only where it means what the eager hooks
        do (_FSDPState.gathers_in_graph): the gradient reduced in param_dtype, every step."""
        gathered = self._in_param_dtype(self.sharded).redistribute(self.mesh, self.gathered_placements)
        return self._unsharded_from(gathered.to_local(grad_placements=self.grad_placements))

    def gather(self, sharded: torch.Tensor) -> torch.Tensor:
        prefetched = self._take_prefetched() if sharded is self.sharded else None
        if prefetched is not None:
            return self._unsharded_from(prefetched)
        local = self._in_param_dtype(sharded).redistribute(self.mesh, self.gathered_placements).to_local()
        if local.data_ptr() == self.sharded._local_tensor.data_ptr():  # one data-parallel rank: no copy was made
            local = local.clone()
        return self._unsharded_from(local)

    def _in_param_dtype(self, sharded: torch.Tensor) -> torch.Tensor:
        param_dtype = self.mp_policy.param_dtype
        if param_dtype is not None and param_dtype != sharded.dtype:
            return sharded.to(param_dtype)  # before the all-gather: half the bytes
        return sharded

    def _unsharded_from(self, local: torch.Tensor) -> torch.Tensor:
        """The gathered piece as the module computes with it: plain, or laid out as tensor
        parallelism left it."""
        if not self.is_shard_tensor:
            return local
        return from_local(local, self.unsharded_mesh, self.unsharded_placements, shape=self.shape,
                          sharding_shapes=self.unsharded_sizes, _trusted_sizes=True)

    # ---- the backward's gradient -------------------------------------------------------
    def reduce(self, grad: torch.Tensor):
        """This rank's gradient term of the unsharded parameter, averaged over the data-parallel
        ranks into the sharded layout, in reduce_dtype (then the parameter's dtype)."""
        self._regathered = None  # every use of it in this backward has run
        if _C.is_shard_tensor(grad):
            if self.is_shard_tensor:
                if tuple(grad.placements) != self.unsharded_placements:  # e.g. Partial over "tp"
                    grad = grad.redistribute(self.unsharded_mesh, self.unsharded_placements,
                                             sharding_shapes=self.unsharded_sizes or None)
            else:  # a plain weight used on ShardTensor activations (PhysicsNeMo's recipe)
                grad = grad.redistribute(grad.device_mesh, [Replicate()] * grad.device_mesh.ndim)
            grad = grad.to_local()
        # FSDP2's default: reduce in param_dtype (as the traced backward does), else the parameter's.
        reduce_dtype = self.mp_policy.reduce_dtype or self.mp_policy.param_dtype or self.sharded.dtype
        grad = grad.to(reduce_dtype)
        if self.pending_grad is not None:
            grad = grad + self.pending_grad
            self.pending_grad = None
        if not self.requires_gradient_sync:
            self.pending_grad = grad
            return None
        terms = self._on_mesh(grad, self.grad_placements, self.unsharded_sizes)
        reduced = terms.redistribute(self.mesh, self.placements, sharding_shapes=self.sharded_sizes or None)
        return reduced.to(self.sharded.dtype)


class _AllGather(torch.autograd.Function):
    """sharded parameter -> the unsharded one; backward: gradient terms -> sharded gradient."""

    @staticmethod
    def forward(ctx, sharded, fsdp_param: FSDPParam):
        ctx.fsdp_param = fsdp_param
        return fsdp_param.gather(sharded)

    @staticmethod
    def backward(ctx, grad):
        return ctx.fsdp_param.reduce(grad), None
