"""DTensor's module API: distribute_module (torch.distributed.tensor.distribute_module) and
parallelize_module (torch.distributed.tensor.parallel.parallelize_module), under their names
and meanings, over ShardTensors whose pieces may differ in size."""

from __future__ import annotations

import inspect
import warnings
from fnmatch import fnmatch

from torch import nn

from .. import _C
from .._placements import Replicate
from .._tensor import _mesh_or_current, distribute_tensor


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


def parallelize_module(module: nn.Module, device_mesh=None, parallelize_plan=None, *, src_data_rank=0) -> nn.Module:
    """DTensor's parallelize_module: applies ParallelStyles to `module` or to its submodules.

    ``parallelize_plan`` is a style (for ``module`` itself) or a dict {module path: style}; a
    path is dotted ("layers.0.mlp.w1"), each part an fnmatch pattern ("layers.*.attention"), and
    "" names ``module``. As in DTensor, a path that matches no submodule is skipped with a
    warning, and ``device_mesh`` must be 1-D: pass the tensor-parallel dim of a larger mesh,
    ``mesh["tp"]``. ``src_data_rank``: whose values the parameters get (None: each rank keeps its
    own). Parameters are split with torch.chunk sizes, so any size works on any number of ranks.
    """
    from .style import ParallelStyle

    mesh = _mesh_or_current(device_mesh, "parallelize_module")
    if mesh.ndim != 1:
        names = mesh.mesh_dim_names or ()
        if "tp" in names or not names:
            example = 'mesh["tp"]' + ("" if names else " (name the mesh dims with init_device_mesh's mesh_dim_names)")
        else:
            example = " or ".join(f'mesh["{name}"]' for name in names)
        raise ValueError(f"parallelize_module: tensor parallelism takes a 1-D DeviceMesh, got the {mesh.ndim}-D "
                         f"{mesh}; pass its tensor-parallel dim, e.g. {example}")
    if parallelize_plan is None:
        warnings.warn("parallelize_module: no parallelize_plan is given, so this call does nothing (as in DTensor)",
                      stacklevel=2)
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan.src_data_rank = src_data_rank
        return parallelize_plan._apply(module, mesh)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"parallelize_module: parallelize_plan must be a ParallelStyle or a dict {{module path: "
                        f"ParallelStyle}}, got {type(parallelize_plan).__name__}")
    for path, style in parallelize_plan.items():
        matched, misses = _resolve(module, path)
        if misses:
            where = "; ".join(f"no child of {prefix or type(module).__name__} ({type(parent).__name__}, children "
                              f"{[name for name, _ in parent.named_children()]}) matches {token!r}"
                              for prefix, parent, token in misses[:3])
            warnings.warn(f"parallelize_module: plan key {path!r} could not be resolved: {where}; skipping it there "
                          f"(as DTensor does)", stacklevel=2)
        for submodule in matched:
            parallelize_module(submodule, mesh, style, src_data_rank=src_data_rank)
    return module


def _resolve(module: nn.Module, path: str):
    """The submodules a plan key names (each dotted part an fnmatch pattern; "" is `module`), and
    where it matched nothing: [(path so far, module there, the part that matched no child)]."""
    found, misses = [("", module)], []
    for token in path.split(".") if path else []:
        deeper = []
        for prefix, parent in found:
            children = [(f"{prefix}.{name}" if prefix else name, child)
                        for name, child in parent.named_children() if fnmatch(name, token)]
            if not children:
                misses.append((prefix, parent, token))
            deeper += children
        found = deeper
    return [m for _, m in found], misses
