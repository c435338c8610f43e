"""DTensor's parallelize_module (torch.distributed.tensor.parallel.parallelize_module), under its
name and meaning, over ShardTensors whose pieces may differ in size."""

from __future__ import annotations

import warnings
from fnmatch import fnmatch

from torch import nn

from .._args import _mesh_or_current
from .style import ParallelStyle


def parallelize_module(module: nn.Module, device_mesh=None, parallelize_plan=None, *, src_data_rank=0) -> nn.Module:
    """DTensor's parallelize_module: applies ParallelStyles to `module` or to its submodules.

    ``parallelize_plan`` is a style (for ``module`` itself) or a dict {module path: style}; a
    path is dotted ("layers.0.mlp.w1"), each part an fnmatch pattern ("layers.*.attention"), and
    "" names ``module``. As in DTensor, a path that matches no submodule is skipped with a
    warning, and ``device_mesh`` must be 1-D: pass the tensor-parallel dim of a larger mesh,
    ``mesh["tp"]``. ``src_data_rank``: whose values the parameters get (None: each rank keeps its
    own). Parameters are split with torch.chunk sizes, so any size works on any number of ranks.
    """
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
