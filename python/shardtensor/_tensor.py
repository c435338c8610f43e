"""ShardTensors in Python: building them, looking inside them, and the methods every tensor gains.

A ShardTensor is a plain torch.Tensor in Python (its C++ TensorImpl is shardtensor's), so every
operator on it dispatches in C++ without a Python hook. What DTensor offers as methods of its
subclass (placements, device_mesh, to_local, full_tensor, redistribute) are installed on
torch.Tensor once, at import; they raise for tensors that are not sharded, so every result of
every op has them. This module also fixes what a ShardTensor does where torch would read its
storage: repr shows the layout and this rank's piece (no collective), and numpy(), tolist(),
pickling and torch.save raise an error that names to_local() and full_tensor().
"""

from __future__ import annotations

import torch

from . import _C, _handlers, _placements, _traceable
from ._args import _encode_sizes, _mesh_or_current
from ._mesh import DeviceMesh, from_torch_mesh, mesh_of_cpp
from ._spec import ShardTensorSpec

_Traced = _traceable.TraceableShardTensor


def is_shard_tensor(t) -> bool:
    """Whether ``t`` is a ShardTensor (inside a compiled region, its traceable form)."""
    if isinstance(t, _Traced):
        return True
    # In a compiled region every ShardTensor is a traceable one (_traceable.py).
    return not torch.compiler.is_compiling() and isinstance(t, torch.Tensor) and _C.is_shard_tensor(t)


class _ShardTensorMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Tensor) and _C.is_shard_tensor(obj)

    # PhysicsNeMo's class attributes: the handler registries (dicts the dispatcher follows, so
    # that assigning a saved copy back restores the handlers it held) and the patch switch.
    def __getattr__(cls, name):
        if name in _handlers.REGISTRIES:
            return _handlers.REGISTRIES[name]
        if name == "_enable_shard_patches":
            return _handlers.patches["enabled"]
        raise AttributeError(f"type object 'ShardTensor' has no attribute {name!r}")

    def __setattr__(cls, name, value):
        if name in _handlers.REGISTRIES:
            _handlers.REGISTRIES[name].replace_with(value)
        elif name == "_enable_shard_patches":
            _handlers.patches["enabled"] = bool(value)
        else:
            super().__setattr__(name, value)


class ShardTensor(metaclass=_ShardTensorMeta):
    """The type of sharded tensors, for isinstance() and for PhysicsNeMo's constructors.

    isinstance(x, ShardTensor) is true for every sharded torch.Tensor, whichever op made it.
    """

    def __new__(cls, *args, **kwargs):
        raise TypeError("ShardTensor is not constructed directly; use ShardTensor.from_local(), "
                        "distribute_tensor() or scatter_tensor()")

    @staticmethod
    def from_local(local_tensor, device_mesh=None, placements=None, sharding_shapes="chunk", global_shape=None, *,
                   run_check=False, shape=None, stride=None):
        """PhysicsNeMo's signature; ``global_shape`` is DTensor's ``shape``, checked against the pieces."""
        if global_shape is not None and shape is not None and tuple(global_shape) != tuple(shape):
            raise ValueError(f"ShardTensor.from_local: global_shape={tuple(global_shape)} and shape={tuple(shape)} "
                             "differ; pass one of them")
        return from_local(local_tensor, device_mesh, placements, run_check=run_check,
                          shape=shape if global_shape is None else global_shape, stride=stride,
                          sharding_shapes=sharding_shapes)

    @staticmethod
    def from_dtensor(dtensor):
        return from_dtensor(dtensor)

    # ---- PhysicsNeMo's handler registries (see _handlers) ----
    @classmethod
    def register_dispatch_handler(cls, op, handler) -> None:
        """``handler(*args, **kwargs)`` runs ``op`` (an ATen OpOverload) on ShardTensors, in place
        of its sharding rule, below autograd; it returns ShardTensors."""
        _handlers.REGISTRIES["_dispatch_registry"][op] = handler

    @classmethod
    def register_function_handler(cls, func, handler) -> None:
        """``handler(func, types, args, kwargs)`` runs the Python function ``func`` (an ``F.*``
        function, a torch function or a Tensor method) when a ShardTensor is among its arguments."""
        _handlers.REGISTRIES["_function_registry"][func] = handler

    @classmethod
    def register_named_function_handler(cls, func_name: str, handler) -> None:
        """Like register_function_handler, for an operator made with torch.library.custom_op
        ("mylib.op.default") or a function by its import path ("torch.nn.functional.gelu")."""
        _handlers.REGISTRIES["_named_function_registry"][func_name] = handler

    @classmethod
    def patches_enabled(cls) -> bool:
        """Whether function handlers run (``ShardTensor._enable_shard_patches = False`` turns them off)."""
        return _handlers.patches["enabled"]


_handlers._SHARD_TYPES = (ShardTensor,)


def _require(t, what: str):
    if not (isinstance(t, torch.Tensor) and _C.is_shard_tensor(t)):
        raise TypeError(f"{what}: expected a ShardTensor, got a plain {type(t).__name__}")



def _mesh_and_placements(device_mesh, placements, what: str):
    """The mesh (given, or the current one) and the placements encoded for it (default: Replicate)."""
    mesh = _mesh_or_current(device_mesh, what)
    if placements is None:
        placements = [_placements.Replicate()] * mesh.ndim
    return mesh, _placements.encode(placements, mesh.ndim)


def from_local(local_tensor, device_mesh=None, placements=None, *, run_check=False, shape=None, stride=None,
               sharding_shapes="chunk", _trusted_sizes=False):
    """A ShardTensor from this rank's piece (DTensor.from_local, with uneven sizes).

    sharding_shapes: "chunk" (torch.chunk sizes; with `shape`, any chunk split of it),
    "infer" (one all-gather of local shapes), or explicit sizes (see _encode_sizes).
    _trusted_sizes (internal): the explicit sizes follow from a layout every rank shares (a
    parallel style's weights), so the agreement all-gather is skipped.
    """
    if not isinstance(local_tensor, torch.Tensor):
        raise TypeError(f"from_local: local_tensor must be a torch.Tensor, got {type(local_tensor).__name__}")
    if torch.compiler.is_compiling():
        # dynamo treats a mesh as opaque: it is resolved inside, where the layout is built.
        encoded = None if placements is None else _placements.encode(placements)
        return _traceable.from_local_in_graph(local_tensor, device_mesh, encoded, sharding_shapes,
                                              None if shape is None else [int(s) for s in shape], _trusted_sizes)
    mesh, encoded = _mesh_and_placements(device_mesh, placements, "from_local")
    if isinstance(sharding_shapes, str):
        if sharding_shapes not in ("chunk", "infer"):
            raise ValueError(f"from_local: sharding_shapes={sharding_shapes!r}; allowed are 'chunk', 'infer' or a dict")
        mode, sizes = sharding_shapes, None
    else:
        mode = "trusted" if _trusted_sizes else "given"
        sizes = _encode_sizes(sharding_shapes, _placements.decode(encoded), mesh)
    global_shape = [int(s) for s in shape] if shape is not None else None
    out = _C.from_local(local_tensor, mesh._cpp, encoded, mode, global_shape, sizes, run_check)
    # A shape given beside inferred or explicit sizes is the user's word, checked over the mesh.
    # Not for chunk sizes (cut from the shape itself), nor for trusted sizes: those come from a
    # layout every rank shares, and the shape with them (a parallel style's input, every forward).
    if global_shape is not None and mode in ("infer", "given"):
        _check_shape_of_pieces(out, mesh, global_shape, sharding_shapes)
    if stride is not None and tuple(int(s) for s in stride) != out.stride():
        # The global strides follow from the local piece's memory order; DTensor takes them on
        # trust, so a wrong one would only surface as wrong views later.
        raise ValueError(f"from_local: stride={tuple(stride)} does not describe the global tensor of shape "
                         f"{tuple(out.shape)} laid out like the local piece, whose strides are {out.stride()}")
    return out


def _check_shape_of_pieces(out, mesh: DeviceMesh, shape: list[int], sharding_shapes) -> None:
    """A shape given beside inferred or explicit sizes must be the one the pieces make. Every
    rank of the mesh learns whether any rank's differs (one all-reduce of a flag per mesh dim),
    so a rank that passed another shape than the others fails them all, not only itself."""
    import torch.distributed as dist

    mine_differs = tuple(out.shape) != tuple(shape)
    anyone_differs = mine_differs
    if mesh.get_coordinate() is not None and mesh.size() > 1:
        flag = torch.tensor([int(mine_differs)], device=mesh._cpp.device)
        for d in range(mesh.ndim):  # a maximum along every mesh dim in turn is one over the mesh
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=mesh.get_group(d))
        anyone_differs = bool(flag.item())
    if not anyone_differs:
        return
    how = f"sharding_shapes={sharding_shapes!r}" if isinstance(sharding_shapes, str) else "the given sharding_shapes"
    if mine_differs:
        raise ValueError(f"from_local: the global shape {tuple(shape)} does not match the pieces, which make a tensor of "
                         f"shape {tuple(out.shape)} ({how}); pass the shape the local pieces concatenate to")
    raise ValueError(f"from_local: another rank's global shape does not match the pieces, which make a tensor of shape "
                     f"{tuple(out.shape)} ({how}); every rank must pass the same global shape")


def distribute_tensor(tensor, device_mesh=None, placements=None, *, src_data_rank=0, sharding_shapes=None):
    """Shards a tensor that every rank holds.

    As in DTensor, the source of truth is the rank at coordinate ``src_data_rank`` of each mesh
    dim (default 0): each rank receives its piece of that rank's tensor. With ``None`` each rank
    keeps its piece of its own tensor and no data moves."""
    if src_data_rank is not None and (isinstance(src_data_rank, bool) or not isinstance(src_data_rank, int)):
        raise TypeError(f"distribute_tensor: src_data_rank must be an int or None, got {src_data_rank!r}")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"distribute_tensor: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if torch.compiler.is_compiling() and src_data_rank is None:
        # Each rank keeps its piece of its own tensor: a replicated from_local, then a local slice.
        whole = _traceable.from_local_in_graph(tensor, device_mesh, None, "chunk", None, False)
        return whole if placements is None else _redistribute(whole, device_mesh, placements, sharding_shapes=sharding_shapes)
    mesh, encoded = _mesh_and_placements(device_mesh, placements, "distribute_tensor")
    sizes = _encode_sizes(sharding_shapes, _placements.decode(encoded), mesh)
    return _C.distribute_tensor(tensor, mesh._cpp, encoded, sizes, src_data_rank)


def scatter_tensor(tensor, global_src, mesh, placements, global_shape=None, dtype=None, requires_grad=False):
    """Shards a tensor that only global rank `global_src` has (PhysicsNeMo's scatter_tensor).

    ``global_shape`` and ``dtype``, where the other ranks know them, are checked against the
    source's tensor on every rank, and save the broadcast of its shape."""
    mesh = _mesh_or_current(mesh, "scatter_tensor")
    if global_shape is not None:
        if isinstance(global_shape, torch.Tensor) or not all(isinstance(s, int) and not isinstance(s, bool) for s in global_shape):
            raise ValueError(f"scatter_tensor: global_shape must be a sequence of ints, got {global_shape!r}")
        global_shape = [int(s) for s in global_shape]
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ValueError(f"scatter_tensor: dtype must be a torch.dtype, got {dtype!r}")
    return _C.scatter_tensor(tensor, int(global_src), mesh._cpp, _placements.encode(placements, mesh.ndim), requires_grad,
                             global_shape, dtype)


# ---- the methods every torch.Tensor gains -----------------------------------------------

def _placements_of(self):
    if isinstance(self, _Traced):
        return _traceable.placements_of(self)
    if not _C.is_shard_tensor(self):
        raise AttributeError("placements: this tensor is not a ShardTensor")
    return _placements.decode(_C.placements(self))


def _device_mesh_of(self):
    if isinstance(self, _Traced):
        return _traceable.mesh_of_layout(self._layout)
    if not _C.is_shard_tensor(self):
        raise AttributeError("device_mesh: this tensor is not a ShardTensor")
    return mesh_of_cpp(_C.mesh(self))


def _to_local(self, *, grad_placements=None):
    if isinstance(self, _Traced):
        return _Traced.to_local(self, grad_placements=grad_placements)
    _require(self, "to_local")
    return _C.to_local(self, None if grad_placements is None else _placements.encode(grad_placements))


def _full_tensor(self, *, grad_placements=None):
    if isinstance(self, _Traced):
        return _Traced.full_tensor(self, grad_placements=grad_placements)
    _require(self, "full_tensor")
    return _C.full_tensor(self, None if grad_placements is None else _placements.encode(grad_placements))


def _redistribute(self, device_mesh=None, placements=None, *, async_op=False, sharding_shapes=None, transport=None,
                  peer_memory=None):
    # transport: "auto", "collectives" or "messages"; peer_memory: whether same-host CPU ranks may
    # copy through each other's memory. None takes this process's default (SHARDTENSOR_TRANSPORT,
    # SHARDTENSOR_PEER_MEMORY). Every rank must pass the same.
    if isinstance(self, _Traced):
        return _Traced.redistribute(self, device_mesh, placements, sharding_shapes=sharding_shapes)
    _require(self, "redistribute")
    if placements is None:  # DTensor's error (and type): a target layout is the call's point
        raise RuntimeError("redistribute: placements is needed (the target layout, one placement per mesh dim); "
                           f"this tensor's are {_placements_of(self)}")
    mesh = mesh_of_cpp(_C.mesh(self)) if device_mesh is None else _mesh_or_current(device_mesh, "redistribute")
    encoded = _placements.encode(placements, mesh.ndim)
    return _C.redistribute(self, mesh._cpp, encoded, _encode_sizes(sharding_shapes, _placements.decode(encoded), mesh),
                           transport, peer_memory)


def _local_shape(self):
    _require(self, "local_shape")
    return torch.Size(_C.local_shape(self))


def _shard_sizes(self):
    """{tensor dim: [size of every piece]} for each sharded tensor dim: what rebuilds the layout
    (from_local's and redistribute's ``sharding_shapes`` take it back)."""
    if isinstance(self, _Traced):
        return _traceable.shard_sizes_of(self._layout)
    _require(self, "shard_sizes")
    return {dim: list(sizes) for dim, sizes in _C.shard_sizes(self)}


def _sharding_shapes(self, mesh_dim=None):
    """PhysicsNeMo's: {mesh dim: (local shape of each rank along it, ...)}; see ShardTensorSpec."""
    _require(self, "sharding_shapes")
    return ShardTensorSpec(self).sharding_shapes(mesh_dim)


def _offsets(self, mesh_dim=None):
    """PhysicsNeMo's: per mesh dim, where this rank's piece starts; see ShardTensorSpec."""
    _require(self, "offsets")
    return ShardTensorSpec(self).offsets(mesh_dim)


def _local_tensor_of(self):
    # DTensor's and PhysicsNeMo's attribute: the local piece itself, outside autograd (to_local()
    # is the differentiable way).
    _require(self, "_local_tensor")
    with torch.no_grad():
        return _C.to_local(self, None).detach()


def _spec_of(self):
    if not _C.is_shard_tensor(self):
        raise AttributeError("_spec: this tensor is not a ShardTensor")
    return ShardTensorSpec(self)


def describe(t) -> str:
    """Global shape, dtype, placements, mesh, shard sizes and this rank's piece: no collective."""
    _require(t, "describe")
    return _C.describe(t)


def _make_repr(original):
    def __repr__(self, *args, **kwargs):
        if not _C.is_shard_tensor(self):
            return original(self, *args, **kwargs)
        with torch.no_grad():
            local = _C.to_local(self, None)
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"{_C.describe(self)}{grad}\nlocal piece: {local!r}"

    return __repr__


def _refusing(name: str, original):
    why = (f"{name}() of a ShardTensor would need the whole tensor; call x.to_local().{name}() for this rank's "
           f"piece or x.full_tensor().{name}() for the whole tensor (a collective)")

    def method(self, *args, **kwargs):
        if _C.is_shard_tensor(self):
            raise TypeError(why)
        return original(self, *args, **kwargs)

    method.__name__ = name
    return method


def _make_reduce_ex(original):
    def __reduce_ex__(self, protocol):
        if _C.is_shard_tensor(self):
            raise TypeError("a ShardTensor cannot be pickled or torch.save()d: its data lives on many processes. "
                            "Save x.to_local() (with x.placements and x.shard_sizes()) on every rank, or "
                            "x.full_tensor() on one")
        return original(self, protocol)

    return __reduce_ex__


def _make_deepcopy(original):
    def __deepcopy__(self, memo):
        if not _C.is_shard_tensor(self):
            return original(self, memo)
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            copy = self.clone()
        copy.requires_grad_(self.requires_grad)
        if isinstance(self, torch.nn.Parameter):
            copy = torch.nn.Parameter(copy, requires_grad=self.requires_grad)
        memo[id(self)] = copy
        return copy

    return __deepcopy__


_TENSOR_ATTRIBUTES = {
    "placements": property(_placements_of),
    "device_mesh": property(_device_mesh_of),
    "to_local": _to_local,
    "full_tensor": _full_tensor,
    "redistribute": _redistribute,
    "local_shape": property(_local_shape),
    "shard_sizes": _shard_sizes,
    "sharding_shapes": _sharding_shapes,
    "offsets": _offsets,
    "_spec": property(_spec_of),
    "_local_tensor": property(_local_tensor_of),
}


def install_tensor_methods() -> None:
    """Adds the ShardTensor attributes to torch.Tensor and guards the storage-reading ones."""
    T = torch.Tensor
    if getattr(T, "_shardtensor_installed", False):
        return
    for name, value in _TENSOR_ATTRIBUTES.items():
        if name in T.__dict__ or any(name in base.__dict__ for base in T.__mro__[1:]):
            raise RuntimeError(f"shardtensor: torch.Tensor already has an attribute {name!r} in torch "
                               f"{torch.__version__}; this shardtensor does not support that torch")
        setattr(T, name, value)
    T.__repr__ = _make_repr(T.__repr__)
    T.__reduce_ex__ = _make_reduce_ex(T.__reduce_ex__)
    T.__deepcopy__ = _make_deepcopy(T.__deepcopy__)
    for name in ("numpy", "tolist", "__array__"):
        setattr(T, name, _refusing(name, getattr(T, name)))
    T._shardtensor_installed = True


# ---- torch's DTensor -----------------------------------------------------------------------

def to_dtensor(x):
    """torch's DTensor over the same process groups and the same local tensor (no copy)."""
    _require(x, "to_dtensor")
    from torch.distributed.tensor import DTensor

    mesh = mesh_of_cpp(_C.mesh(x))
    placements = _placements_of(x)
    for dim, sizes in _C.shard_sizes(x):
        expected = [len(c) for c in torch.arange(x.shape[dim]).chunk(_pieces(mesh, placements, dim))]
        expected += [0] * (len(sizes) - len(expected))
        if list(sizes) != expected:
            raise ValueError(f"to_dtensor: dim {dim} is split {list(sizes)}, but DTensor only knows torch.chunk splits "
                             f"({expected}); redistribute to chunk sizes first")
    return DTensor.from_local(_C.to_local(x, None), mesh.to_torch(), _placements.to_torch(placements), run_check=False,
                              shape=x.shape, stride=x.stride())


def _pieces(mesh: DeviceMesh, placements, dim: int) -> int:
    n = 1
    for d, p in enumerate(placements):
        if p.is_shard(dim):
            n *= mesh.size(d)
    return n


def from_dtensor(dtensor):
    """A ShardTensor over the same process groups and the same local tensor as a DTensor (no copy)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(dtensor, DTensor):
        raise TypeError(f"from_dtensor: expected a torch.distributed.tensor.DTensor, got {type(dtensor).__name__}")
    mesh = from_torch_mesh(dtensor.device_mesh)
    return from_local(dtensor.to_local(), mesh, dtensor.placements, shape=dtensor.shape)
