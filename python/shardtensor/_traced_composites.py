"""Composite operators on traced ShardTensors, taken as eager mode takes them.

A composite operator (CompositeImplicitAutograd) decomposes before a tensor subclass sees it,
and while torch traces, the Python dispatcher decomposes some more (torch._decomp's Python
kernels). Eager mode's C++ dispatch takes some of these whole, or decomposes them its own way
(src/dispatch/library.cpp), because torch's decomposition loses the layout; on a traced
ShardTensor the same operators go the same way:

- upsample_* (F.interpolate): torch decomposes them into _unsafe_index over computed indices,
  which no rule can recognise; whole, they reach shardtensor's resampling rules (halos
  included), forward and backward;
- linear on an input split along a leading dim: torch flattens the leading dims into one, which
  a split dim below the first cannot survive without gathering; the split dim moves first, as
  eager mode's linear_on_shards does (src/dispatch/decompositions.cpp).

Plain tensors decompose as before. Installed once, when dynamo is taught (_compile_trace.py).
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

from . import _placements
from ._traceable import TraceableShardTensor

_KEYS = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)


def keep_whole() -> None:
    _keep_resampling_whole()
    _on_traced(torch.ops.aten.linear.default, _linear_on_its_split, keys=(DispatchKey.CompositeImplicitAutograd,))


def _on_traced(op, kernel, keys=_KEYS) -> None:
    """Runs ``kernel`` for ``op`` where its first argument is a traced ShardTensor, at ``keys``
    of the Python dispatcher; elsewhere the kernel that was there (torch's Python one, or the
    C++ composite)."""
    for key in keys:
        before = op.py_kernels.get(key)
        if getattr(before, "_shardtensor_traced", False):
            continue
        if before is None:
            def before(*args, _key=key, **kwargs):
                return op._op_dk(_key, *args, **kwargs)

        def dispatch(*args, _before=before, **kwargs):
            if isinstance(args[0], TraceableShardTensor):
                return kernel(*args, **kwargs)
            return _before(*args, **kwargs)

        dispatch._shardtensor_traced = True
        op.py_kernels[key] = dispatch
    op._dispatch_cache.clear()


def _linear_on_its_split(input, weight, bias=None):
    if input.dim() < 3:
        return _linear(input, weight, bias)
    split = [p.dim for p in _placements.decode(input._layout.placements)
             if isinstance(p, _placements.Shard) and p.dim % input.dim() < input.dim() - 1]
    # One split leading dim other than the first moves first; two cannot both survive a
    # flattening either way (torch's, which gathers).
    if len(split) != 1 or split[0] % input.dim() == 0:
        return _linear(input, weight, bias)
    d = split[0] % input.dim()
    return _linear(input.movedim(d, 0), weight, bias).movedim(0, d)


def _linear(input, weight, bias):
    return torch.ops.aten.linear.default._op_dk(DispatchKey.CompositeImplicitAutograd, input, weight, bias)


def _keep_resampling_whole() -> None:
    from torch._decomp.decompositions import upsample_compute_output_size

    class WholeResample(torch.autograd.Function):
        """The sized operator below autograd (where the wrapper hands it to shardtensor's
        kernel), with its ``*_backward`` operator as its derivative."""

        @staticmethod
        def forward(ctx, sized, backward, x, output_size, *rest):  # rest: [align_corners,] scales...
            ctx.backward, ctx.output_size, ctx.rest, ctx.input_size = backward, output_size, rest, list(x.shape)
            with torch._C._AutoDispatchBelowAutograd():
                return sized(x, output_size, *rest)

        @staticmethod
        def backward(ctx, grad):
            dx = ctx.backward(grad, ctx.output_size, ctx.input_size, *ctx.rest)
            return None, None, dx, None, *([None] * len(ctx.rest))

    def sized_from_vec(sized):
        # (input, output_size, [align_corners,] scale_factors) -> (input, sizes, [align_corners,] scales...)
        def run(input, output_size, *rest):
            *middle, scale_factors = rest
            sizes = upsample_compute_output_size(input.size(), output_size, scale_factors)
            return sized(input, sizes, *middle, *(scale_factors or [None] * len(sizes)))
        return run

    for name in dir(torch.ops.aten):
        if not name.lstrip("_").startswith("upsample_") or name.endswith("_backward"):
            continue
        packet = getattr(torch.ops.aten, name)
        backward = getattr(torch.ops.aten, f"{name}_backward", None)
        if backward is None or "vec" not in packet.overloads() or "default" not in packet.overloads():
            continue
        _on_traced(packet.vec, sized_from_vec(packet.default))
        _on_traced(packet.default, lambda *args, _sized=packet.default, _backward=backward.default:
                   WholeResample.apply(_sized, _backward, *args))
