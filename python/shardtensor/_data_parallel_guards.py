"""torch's own data-parallel wrappers, given a module with ShardTensor parameters, raise at once,
naming the parameter and what to use, instead of failing deep inside torch ("Cannot access
storage of TensorImpl", "No backend type associated with device type privateuseone"): FSDP2
knows distributed tensors only as DTensors, and DDP replicates plain tensors.

For fully_shard the check wraps the function FSDP2 collects a module's parameters with, which
runs before it shards or communicates anything (looked up as a module global at each call, it
catches every way of importing fully_shard); for DistributedDataParallel it runs first in its
constructor, before its first broadcast.
"""

from __future__ import annotations

import torch

from . import _C
from ._after_import import after_import


def install() -> None:
    after_import("torch.distributed.fsdp._fully_shard._fsdp_init", _guard)
    _guard_ddp()


def _guard_ddp() -> None:
    ddp = torch.nn.parallel.DistributedDataParallel
    init = ddp.__init__
    if getattr(init, "_shardtensor_guard", False):
        return

    def __init__(self, module, *args, **kwargs):
        ignored = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        for name, param in module.named_parameters():
            if name not in ignored and _C.is_shard_tensor(param):
                raise TypeError(
                    f"torch.nn.parallel.DistributedDataParallel: parameter {name!r} is a ShardTensor; DDP replicates "
                    f"plain parameters. Shard the data-parallel dim with shardtensor.fsdp.fully_shard(module, "
                    f"mesh=mesh['dp']), or keep the weights plain with the activations split (PhysicsNeMo's recipe) "
                    f"under DDP")
        init(self, module, *args, **kwargs)

    __init__._shardtensor_guard = True
    ddp.__init__ = __init__


def _guard(_fsdp_init) -> None:
    collect = getattr(_fsdp_init, "_get_managed_states", None)
    if collect is None or getattr(collect, "_shardtensor_guard", False):
        return  # another torch layout: its fully_shard fails as it does

    def _get_managed_states(modules, *args, **kwargs):
        params, buffers = collect(modules, *args, **kwargs)
        shard_tensors = [p for p in params if _C.is_shard_tensor(p)]
        if shard_tensors:
            # Its name from the outermost module that holds it (the one passed to fully_shard).
            names = [n for module in modules for n, p in module.named_parameters() if p is shard_tensors[0]]
            name = max(names, key=len, default="?")
            raise TypeError(
                f"torch.distributed.fsdp.fully_shard: parameter {name!r} is a ShardTensor ({len(shard_tensors)} of the "
                f"module's parameters are); torch's FSDP2 shards only plain tensors and DTensors. Use "
                f"shardtensor.fsdp.fully_shard(module, mesh=...), which takes the same arguments")
        return params, buffers

    _get_managed_states._shardtensor_guard = True
    _fsdp_init._get_managed_states = _get_managed_states
