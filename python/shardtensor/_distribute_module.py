"""DTensor's distribute_module (torch.distributed.tensor.distribute_module) over ShardTensors:
below parallel/, whose styles are built on it."""

from __future__ import annotations

import inspect
import warnings

from torch import nn

from . import _C
from ._args import _mesh_or_current
from ._placements import Replicate
from ._tensor import distribute_tensor


def _replicate_parameters_and_buffers(module: nn.Module, mesh) -> None:
    """Every parameter and buffer of `module` itself that is not a ShardTensor yet becomes a
    replicated one (rank 0's values), as DTensor's distribute_module does after partition_fn."""
    replicate = [Replicate()] * mesh.ndim
    for name, param in module._parameters.items():
        if param is not None and not _C.is_shard_tensor(param):
            module.register_parameter(name, nn.Parameter(distribute_tensor(param.detach(), mesh, replicate),
                                                         requires_grad=param.requires_grad))
    for name, buffer in module._buffers.items():
        if buffer is not None and not _C.is_shard_tensor(buffer):
            module._buffers[name] = distribute_tensor(buffer, mesh, replicate)


def _hook_arity(fn, what: str) -> int:
    arity = len(inspect.signature(fn).parameters)
    if arity == 2:
        warnings.warn(f"distribute_module: an {what} that takes two arguments ({what.split('_')[0]}s, device_mesh) is "
                      f"deprecated, as in DTensor; take (module, {what.split('_')[0]}s, device_mesh)", FutureWarning,
                      stacklevel=3)
    elif arity != 3:
        raise ValueError(f"distribute_module: {what} takes 3 arguments (module, {what.split('_')[0]}s, device_mesh), "
                         f"got a function of {arity}")
    return arity


def distribute_module(module: nn.Module, device_mesh=None, partition_fn=None, input_fn=None,
                      output_fn=None) -> nn.Module:
    """DTensor's distribute_module: the parameters and buffers of `module` become ShardTensors, and
    hooks convert its inputs and outputs at run time.

    partition_fn(name, submodule, device_mesh) runs on every submodule (``module`` itself as
    ""), in named_modules() order, and replaces what it shards in place
    (``submodule.register_parameter(n, nn.Parameter(distribute_tensor(...)))``, any sizes);
    every parameter and buffer it leaves plain is then replicated from rank 0. Without it,
    all are replicated. input_fn(module, inputs, device_mesh) runs as a forward pre-hook of
    ``module`` and returns the new positional inputs; output_fn(module, outputs, device_mesh)
    as a forward hook and returns the new outputs. Returns ``module``, changed in place; a
    second call on the same module raises, as DTensor's does.
    """
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError("distribute_module should only be called once on a module, but it has already been "
                           "called on this module (as in DTensor)")
    mesh = _mesh_or_current(device_mesh, "distribute_module")
    for name, submodule in module.named_modules():
        if partition_fn is not None:
            partition_fn(name, submodule, mesh)
        _replicate_parameters_and_buffers(submodule, mesh)
    if input_fn is not None:
        if _hook_arity(input_fn, "input_fn") == 2:
            module.register_forward_pre_hook(lambda _, inputs: input_fn(inputs, mesh))
        else:
            module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, mesh))
    if output_fn is not None:
        if _hook_arity(output_fn, "output_fn") == 2:
            module.register_forward_hook(lambda _, inputs, outputs: output_fn(outputs, mesh))
        else:
            module.register_forward_hook(lambda mod, inputs, outputs: output_fn(mod, outputs, mesh))
    module._distribute_module_applied = True
    return module
