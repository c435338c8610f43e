"""reshard_after_forward: a module's unsharded parameters are not kept from its forward to its
backward.

While such a module's forward runs, autograd's saved-tensor hooks replace each saved tensor
that is (a view of) one of its unsharded parameters by a note of which parameter and which view
of it; the backward gathers the parameter again the first time it unpacks one (one all-gather
per parameter, kept until that parameter's gradient is reduced) and rebuilds the view. So
between a module's forward and its backward only its sharded parameters stay in memory, as in
FSDP2. Saved tensors are told apart by the storage of their (local) tensor, which the unsharded
parameter of a running forward holds alone.
"""

from __future__ import annotations

import contextlib

import torch

from .. import _C
from .._tensor import from_local

# storage address of the local tensor of an unsharded parameter whose module's forward is
# running -> (its FSDPParam, where that local tensor starts in the storage)
_LIVE: dict = {}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if _C.is_shard_tensor(t) else t


def _storage_key(t: torch.Tensor):
    local = _local(t)
    if local.layout != torch.strided or local.device.type == "meta":
        return None
    return local.untyped_storage().data_ptr()


class _Regather:
    """A saved view of an unsharded parameter, rebuilt from the parameter gathered again."""

    __slots__ = ("param", "size", "stride", "offset", "layout")

    def __init__(self, param, start: int, t: torch.Tensor):
        local = _local(t)
        self.param = param
        param.saved_for_backward = True  # what backward prefetch starts (_prefetch.py)
        self.size, self.stride = local.size(), local.stride()
        self.offset = local.storage_offset() - start
        self.layout = (t.device_mesh, t.placements, t.shape, t.shard_sizes()) if _C.is_shard_tensor(t) else None

    def rebuild(self) -> torch.Tensor:
        whole = _local(self.param.regathered())
        local = whole.as_strided(self.size, self.stride, whole.storage_offset() + self.offset)
        if self.layout is None:
            return local
        mesh, placements, shape, sizes = self.layout
        return from_local(local, mesh, placements, shape=shape, sharding_shapes=sizes, _trusted_sizes=True)


# Run as Python, also for a compiled region's saved tensors (its pieces): a note is about
# storage addresses, which a graph does not have.
@torch.compiler.disable
def _pack(t: torch.Tensor):
    if _LIVE:
        key = _storage_key(t)
        live = _LIVE.get(key) if key is not None else None
        if live is not None:
            return _Regather(*live, t)
    return t


@torch.compiler.disable
def _unpack(saved):
    return saved.rebuild() if isinstance(saved, _Regather) else saved


def enter(params, unsharded) -> contextlib.AbstractContextManager:
    """Starts a forward of a module that reshards after it: its unsharded parameters' views are
    saved as notes. Returns the hooks' context, to exit when the forward ends."""
    for param, tensor in zip(params, unsharded):
        _LIVE[_storage_key(tensor)] = (param, _local(tensor).storage_offset())
    hooks = torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
    hooks.__enter__()
    return hooks


def leave(hooks, unsharded) -> None:
    hooks.__exit__(None, None, None)
    for tensor in unsharded:
        _LIVE.pop(_storage_key(tensor), None)
