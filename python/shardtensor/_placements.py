"""Placements, under DTensor's names and meanings: Shard(dim), Replicate(), Partial(op).

They are torch's own: each class subclasses torch.distributed.tensor's, so shardtensor's and
torch's placements are one vocabulary (equal both ways, equal hashes, isinstance of torch's).
Only ZigzagShard and NormPartial add layouts, and they equal no plain Shard or Partial. Every
function of shardtensor also accepts torch's objects. Placements cross into C++ as
(kind, value) pairs; see python/src/bindings.h.
"""

from __future__ import annotations

import struct

from torch.distributed.tensor import Partial as _TorchPartial
from torch.distributed.tensor import Placement
from torch.distributed.tensor import Replicate as _TorchReplicate
from torch.distributed.tensor import Shard as _TorchShard
from torch.distributed.tensor._ops._math_ops import _NormPartial

_REDUCE_OPS = ("sum", "avg", "max", "min", "product")


class _Written:
    """What our placements add to torch's: one way to write them down, by constructor arguments.

    A compiled graph writes a placement with ``__fx_repr__`` as a constant of the trace
    (_compile.py) and holds it weakly (torch's placements take weak references); pickle and
    copy rebuild it from the same arguments, where torch's state would drop ZigzagShard's unit.
    """

    __slots__ = ()

    def _arguments(self) -> tuple:
        return ()

    def __fx_repr__(self):
        name = type(self).__name__
        return f"{name}(*{self._arguments()!r})", {name: type(self)}

    def __reduce__(self):
        return type(self), self._arguments()

    def __ne__(self, other):
        # Explicit: torch's base has no __ne__, and object's would not reach a subclass's __eq__
        # first (Shard(1) != ZigzagShard(1) must ask ZigzagShard).
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal


class Shard(_Written, _TorchShard):
    """Splits tensor dim `dim` over the ranks of a mesh dim (uneven splits allowed)."""

    __slots__ = ()

    def __init__(self, dim: int):
        if not isinstance(dim, int):
            raise TypeError(f"Shard(dim): dim must be an int, got {type(dim).__name__}")
        super().__init__(dim)

    def _arguments(self) -> tuple:
        return (self.dim,)

    def __eq__(self, other):
        # torch's _StridedShard is no Shard subclass; a ZigzagShard answers for itself first.
        return isinstance(other, _TorchShard) and not isinstance(other, ZigzagShard) and other.dim == self.dim

    def __hash__(self):
        return hash(self.dim)  # torch's


class ZigzagShard(Shard):
    """Splits tensor dim `dim` in zigzag order: cut into 2n chunks, rank r holds chunks r and
    2n - 1 - r (load-balanced causal attention; see shardtensor.context_parallel). The tensor
    stays the one in order: full_tensor() and redistribute give every position where it was.
    `unit` > 1 where a zigzag sequence was flattened with the dims after it: the chunks are then
    whole multiples of `unit` positions. torch has no such layout: it equals no plain Shard."""

    def __init__(self, dim: int, unit: int = 1):
        super().__init__(dim)
        if not isinstance(unit, int) or unit < 1:
            raise ValueError(f"ZigzagShard(dim, unit): unit must be an int >= 1, got {unit!r}")
        self.unit = unit

    def _arguments(self) -> tuple:
        return (self.dim, self.unit)

    def __eq__(self, other):
        return isinstance(other, ZigzagShard) and other.dim == self.dim and other.unit == self.unit

    def __hash__(self):
        return hash(("zigzag", self.dim, self.unit))

    def __repr__(self):
        return f"ZigzagShard(dim={self.dim})" if self.unit == 1 else f"ZigzagShard(dim={self.dim}, unit={self.unit})"

    def __str__(self):
        return f"Z({self.dim})" if self.unit == 1 else f"Z({self.dim}, unit={self.unit})"


class Replicate(_Written, _TorchReplicate):
    """Every rank of the mesh dim holds the whole tensor."""

    __slots__ = ()

    def __eq__(self, other):
        return isinstance(other, _TorchReplicate)

    def __hash__(self):
        return -1  # torch's (Python makes it -2 for both)


class Partial(_Written, _TorchPartial):
    """Every rank of the mesh dim holds one term of a pending reduction."""

    __slots__ = ()

    def __init__(self, reduce_op: str = "sum"):
        if reduce_op not in _REDUCE_OPS:
            raise ValueError(f"Partial(reduce_op={reduce_op!r}): allowed are {', '.join(map(repr, _REDUCE_OPS))}")
        super().__init__(reduce_op)

    def _arguments(self) -> tuple:
        return (self.reduce_op,)

    def __eq__(self, other):
        return (isinstance(other, _TorchPartial) and not isinstance(other, _NormPartial)
                and other.reduce_op == self.reduce_op)

    def __hash__(self):
        return 1 + hash(self.reduce_op)  # torch's


class NormPartial(_NormPartial, Partial):
    """A pending p-norm (DTensor's ``_NormPartial``, which it is and equals): every rank holds the
    p-norm of its part, the value is the p-norm of those. What a norm over a split dim gives; it
    reduces as a sum of p-th powers, so its ``reduce_op`` is "sum", as torch's. p = 0 and 1 are
    Partial(sum), +-inf Partial(max) / Partial(min)."""

    def __init__(self, norm_type: float = 2.0):
        _NormPartial.__init__(self, float(norm_type))

    def _arguments(self) -> tuple:
        return (self.norm_type,)

    __eq__ = _NormPartial.__eq__
    __hash__ = _NormPartial.__hash__

    def __repr__(self):
        return f"NormPartial(norm_type={self.norm_type:g})"

    def __str__(self):
        return f"P(norm{self.norm_type:g})"


# A NormPartial crosses as (3, the bits of its float p).
def _bits_of(p: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(p)))[0]


def _float_of(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(bits)))[0]


def encode(placements, mesh_ndim: int | None = None) -> list[tuple[int, int]]:
    """Placements (ours or DTensor's) as the (kind, value) pairs the C++ layer takes."""
    if isinstance(placements, Placement) or not hasattr(placements, "__iter__"):
        raise TypeError(f"placements must be a sequence of Shard/Replicate/Partial, one per mesh dim, got {placements!r}")
    placements = tuple(placements)
    if mesh_ndim is not None and len(placements) != mesh_ndim:
        raise ValueError(f"{len(placements)} placements given ({list(placements)}) for a {mesh_ndim}-d mesh; "
                         f"give one per mesh dim")
    out = []
    for p in placements:
        if not all(hasattr(p, q) for q in ("is_shard", "is_replicate", "is_partial")):
            raise TypeError(f"{p!r} is not a placement; use Shard(dim), Replicate() or Partial(op)")
        if getattr(p, "norm_type", None) is not None and p.is_partial():  # ours, or DTensor's _NormPartial
            out.append((3, _bits_of(p.norm_type)))
        elif isinstance(p, ZigzagShard):
            out.append((4, (int(p.unit) << 32) | (int(p.dim) & 0xFFFFFFFF)))
        elif type(p).__name__ == "_StridedShard":
            raise ValueError(f"{p!r}: DTensor's strided shard has no shardtensor placement; redistribute it to "
                             f"Shard or Replicate first")
        elif p.is_shard():
            out.append((0, int(p.dim)))
        elif p.is_replicate():
            out.append((1, 0))
        else:
            op = str(getattr(p, "reduce_op", "sum")).lower().replace("reduceop.", "")
            if op not in _REDUCE_OPS:
                raise ValueError(f"Partial reduce op {op!r} is not supported; allowed are {', '.join(_REDUCE_OPS)}")
            out.append((2, _REDUCE_OPS.index(op)))
    return out


def _zigzag_of(value: int) -> ZigzagShard:
    """A ZigzagShard from its (4, unit << 32 | dim as 32 bits) value."""
    dim = value & 0xFFFFFFFF
    return ZigzagShard(dim - (1 << 32) if dim >= 1 << 31 else dim, value >> 32)


_DECODED: dict[tuple, tuple] = {}


def decode(encoded) -> tuple[Placement, ...]:
    """The C++ (kind, value) pairs as a tuple of placements (memoised: x.placements is cheap)."""
    key = tuple(encoded)
    cached = _DECODED.get(key)
    if cached is None:
        cached = tuple(Shard(v) if k == 0 else Replicate() if k == 1 else Partial(_REDUCE_OPS[v]) if k == 2
                       else NormPartial(_float_of(v)) if k == 3 else _zigzag_of(v) for k, v in key)
        _DECODED[key] = cached
    return cached


def to_torch(placements):
    """Our placements as torch.distributed.tensor's own classes (for to_dtensor): equal already,
    but torch's code may test exact types, and ours add layouts torch has not."""
    out = []
    for p in placements:
        if isinstance(p, ZigzagShard):
            raise ValueError("to_dtensor: DTensor has no zigzag placement; zigzag_unshard the tensor first")
        if p.is_shard():
            out.append(_TorchShard(p.dim))
        elif p.is_replicate():
            out.append(_TorchReplicate())
        elif isinstance(p, _NormPartial):
            out.append(_NormPartial(norm_type=p.norm_type))
        elif p.reduce_op == "product":
            raise ValueError("to_dtensor: DTensor has no Partial(product); redistribute to Replicate first")
        else:
            out.append(_TorchPartial(p.reduce_op))
    return tuple(out)
