"""torch's DTensors as operands beside ShardTensors.

PhysicsNeMo's programs mix the two: torch's ``distribute_module(conv, mesh)`` makes a module's
weights DTensors, and the activations that meet them are ShardTensors. An operator that meets
both runs on ShardTensors: each DTensor is taken as the ShardTensor of the same layout (the same
local tensor, no copy) on the ShardTensors' mesh, through DTensor's ``to_local`` and
``from_local``, so that the gradient reaches the DTensor as a DTensor laid out like it.

Where: DTensor's ``__torch_function__``, the one place that sees the call above autograd (a
ShardTensor is a plain torch.Tensor in Python, and DTensor's ``__torch_dispatch__`` runs below
autograd, too late to route the gradient). torch sets it to the disabled implementation; ours
does what that does unless a ShardTensor is among the arguments, at about 2 us per DTensor
operator on CPU (measured against a DTensor operator's 25-30 us).

The DTensor's mesh must be the ShardTensors' mesh or one of its sub-meshes (a dim of it, by
name, sliced through this rank); on a sub-mesh, the other dims of the ShardTensors' mesh
replicate it. Any other mesh is an error naming both.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from . import _C
from ._mesh import DeviceMesh, root_and_dims
from ._placements import Replicate
from ._tensor import from_local


def _is_shard_tensor(a) -> bool:
    # _tensor.is_shard_tensor without its compile-time branch: this runs on every DTensor operator.
    return isinstance(a, torch.Tensor) and _C.is_shard_tensor(a)


def _first_shard_tensor(args, kwargs):
    """The first ShardTensor among the arguments (and one level into lists), or None."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            for b in a:
                if _is_shard_tensor(b):
                    return b
        elif _is_shard_tensor(a):
            return a
    return None


def _lift(placements, dims, ndim):
    """Placements on a mesh of `ndim` dims of a layout given on its dims `dims`."""
    lifted = [Replicate()] * ndim
    for p, d in zip(placements, dims):
        lifted[d] = p
    return lifted


def layout_on(mesh: DeviceMesh, dtensor) -> list:
    """The DTensor's placements on `mesh` (the ShardTensors'), or a ValueError naming both meshes."""
    theirs = dtensor.device_mesh
    placements = list(dtensor.placements)
    if isinstance(theirs, DeviceMesh):  # torch's API took our mesh as it is (distribute_module)
        if theirs == mesh:
            return placements
        root, dims = root_and_dims(theirs)
        if root == mesh:
            return _lift(placements, dims, mesh.ndim)
    else:
        ours = mesh.to_torch()
        if theirs == ours:
            return placements
        names, all_names = theirs.mesh_dim_names, mesh.mesh_dim_names
        if names and all_names and set(names) <= set(all_names):
            dims = [all_names.index(n) for n in names]
            if dims == sorted(dims) and ours[tuple(names)] == theirs:
                return _lift(placements, dims, mesh.ndim)
    raise ValueError(f"a torch DTensor on {theirs} met ShardTensors on {mesh}: a DTensor operand must be on the "
                     "ShardTensors' mesh or on a sub-mesh of it (mesh['name'])")


def as_shard_tensor(dtensor, mesh: DeviceMesh):
    """The ShardTensor of the DTensor's layout on `mesh`: its local tensor, no copy; the gradient
    goes back through DTensor's to_local, so the DTensor receives it as a DTensor."""
    return from_local(dtensor.to_local(), mesh, layout_on(mesh, dtensor), shape=dtensor.shape)


def _converted(value, mesh):
    if isinstance(value, DTensor):
        return as_shard_tensor(value, mesh)
    if isinstance(value, (list, tuple)) and any(isinstance(v, DTensor) for v in value):
        return type(value)(as_shard_tensor(v, mesh) if isinstance(v, DTensor) else v for v in value)
    return value


def _dtensor_torch_function(cls, func, types, args=(), kwargs=None):
    kwargs = kwargs or {}
    if not torch.compiler.is_compiling():
        partner = _first_shard_tensor(args, kwargs)
        if partner is not None:
            mesh = partner.device_mesh
            args = tuple(_converted(a, mesh) for a in args)
            kwargs = {k: _converted(v, mesh) for k, v in kwargs.items()}
            return func(*args, **kwargs)
    # What torch's _disabled_torch_function_impl does.
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def install() -> None:
    if DTensor.__dict__.get("__torch_function__") is not _installed:
        DTensor.__torch_function__ = _installed


def uninstall() -> None:
    """DTensor as torch ships it (the benchmarks time torch's DTensor so)."""
    DTensor.__torch_function__ = torch._C._disabled_torch_function_impl


_installed = classmethod(_dtensor_torch_function)
