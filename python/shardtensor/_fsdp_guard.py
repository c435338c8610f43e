"""torch's own fully_shard, given a module with ShardTensor parameters, raises at once, naming the
parameter and the call to use, instead of failing deep inside torch ("Cannot access storage of
TensorImpl"): its FSDP2 knows distributed tensors only as DTensors.

The check wraps the function FSDP2 collects a module's parameters with, which runs before it
shards or communicates anything; looked up as a module global at each call, it catches every
way of importing fully_shard.
"""

from __future__ import annotations

from . import _C
from ._after_import import after_import


def install() -> None:
    after_import("torch.distributed.fsdp._fully_shard._fsdp_init", _guard)


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
