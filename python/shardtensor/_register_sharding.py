"""DTensor's ``register_sharding``: an operator's acceptable shardings, written in Python, as its
sharding rule.

    @st.register_sharding(torch.ops.aten._softmax.default)
    def softmax_sharding(x, dim, half_to_float):
        dim = dim % x.ndim
        acceptable = [([Replicate()], [Replicate(), None, None])]
        acceptable += [([Shard(d)], [Shard(d), None, None]) for d in range(x.ndim) if d != dim]
        return acceptable

The function takes the operator's arguments with each tensor replaced by its spec (``mesh``,
``placements``, ``shape``, ``ndim``, ``dtype``, ``tensor_meta``) and returns (output
placements, input placements) pairs for one mesh dim: a placement per tensor output, and one per
argument (``None`` for non-tensors). The C++ rule it becomes combines them over the mesh dims,
costs each combination by what its inputs would move and takes the cheapest, on a propagation
miss only: a call whose layouts were seen before never runs Python.
"""

from __future__ import annotations

import torch

from . import _C, _handlers, _placements
from ._mesh import mesh_of_cpp
from ._spec import TensorMeta

__all__ = ["register_sharding"]


class ArgSpec:
    """A tensor argument as the sharding function sees it (DTensor passes a DTensorSpec)."""

    __slots__ = ("mesh", "placements", "tensor_meta")

    def __init__(self, mesh, placements, shape, dtype):
        self.mesh = mesh_of_cpp(mesh)
        self.placements = _placements.decode(placements)
        shape = torch.Size(shape)
        stride = tuple(int(torch.Size(shape[i + 1:]).numel()) for i in range(len(shape)))
        self.tensor_meta = TensorMeta(shape, stride, dtype)

    @property
    def shape(self) -> torch.Size:
        return self.tensor_meta.shape

    @property
    def ndim(self) -> int:
        return len(self.tensor_meta.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor_meta.dtype

    @property
    def device_mesh(self):
        return self.mesh

    def __repr__(self):
        return f"ArgSpec(shape={tuple(self.shape)}, placements={self.placements}, dtype={self.dtype})"


def _encode_list(placements, what: str):
    if isinstance(placements, _placements.Placement) or not isinstance(placements, (list, tuple)):
        raise TypeError(f"{what} must be a list of placements (None for a non-tensor argument), got {placements!r}")
    return [None if p is None else _placements.encode([p])[0] for p in placements]


def _strategy(fn):
    def strategy(op_name: str, arguments):
        args, kwargs = [], {}
        for name, kwarg_only, kind, payload in arguments:
            value = ArgSpec(*payload) if kind == "tensor" else [ArgSpec(*p) for p in payload] if kind == "tensors" else payload
            if kwarg_only:
                kwargs[name] = value
            else:
                args.append(value)
        acceptable = fn(*args, **kwargs)
        encoded = []
        for i, option in enumerate(acceptable):
            if not isinstance(option, (tuple, list)) or len(option) != 2:
                raise TypeError(f"{fn.__name__} for {op_name}: acceptable sharding {i} is {option!r}; each is a pair "
                                "(output placements, input placements)")
            encoded.append((_encode_list(option[0], f"output placements of acceptable sharding {i}"),
                            _encode_list(option[1], f"input placements of acceptable sharding {i}")))
        return encoded

    return strategy


def register_sharding(op):
    """A decorator: the function's acceptable shardings become the sharding rule of ``op`` (an
    OpOverload, its name, or a list of them), replacing any built-in rule."""
    ops = [_handlers.resolve_operator(o, "register_sharding") for o in (op if isinstance(op, list) else [op])]
    for o in ops:
        _handlers.dispatch_keys_for(o, "register_sharding")  # refuses operators ShardTensors never reach

    def wrapper(fn):
        if not callable(fn):
            raise TypeError(f"register_sharding: expected a function, got {type(fn).__name__}")
        for o in ops:
            _C.register_sharding(_handlers.qualified(o), _strategy(fn))
        return fn

    return wrapper
