"""Placements, under DTensor's names and meanings: Shard(dim), Replicate(), Partial(op).

Every function of shardtensor also accepts torch.distributed.tensor's own placement objects.
Placements cross into C++ as (kind, value) pairs; see python/src/bindings.h.
"""

from __future__ import annotations

import struct

_REDUCE_OPS = ("sum", "avg", "max", "min", "product")


class Placement:
    """Base of the three placements; the is_* queries match DTensor's."""

    __slots__ = ("__weakref__",)  # compiled graphs hold placements as constants, weakly

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False

    def __fx_repr__(self):
        """How a compiled graph writes this placement, a constant of the trace (_compile.py)."""
        name = type(self).__name__
        return f"{name}(*{self._arguments()!r})", {name: type(self)}

    def _arguments(self) -> tuple:
        return ()


class Shard(Placement):
    """Splits tensor dim `dim` over the ranks of a mesh dim (uneven splits allowed)."""

    __slots__ = ("dim",)

    def __init__(self, dim: int):
        if not isinstance(dim, int):
            raise TypeError(f"Shard(dim): dim must be an int, got {type(dim).__name__}")
        self.dim = dim

    def _arguments(self) -> tuple:
        return (self.dim,)

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def __eq__(self, other):
        return isinstance(other, Shard) and not isinstance(other, ZigzagShard) and other.dim == self.dim

    def __hash__(self):
        return hash(("shard", self.dim))

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class ZigzagShard(Shard):
    """Splits tensor dim `dim` in zigzag order: cut into 2n chunks, rank r holds chunks r and
    2n - 1 - r (load-balanced causal attention; see shardtensor.context_parallel). The tensor
    stays the one in order: full_tensor() and redistribute give every position where it was.
    `unit` > 1 where a zigzag sequence was flattened with the dims after it: the chunks are then
    whole multiples of `unit` positions."""

    __slots__ = ("unit",)

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


class Replicate(Placement):
    """Every rank of the mesh dim holds the whole tensor."""

    __slots__ = ()

    def is_replicate(self) -> bool:
        return True

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("replicate")

    def __repr__(self):
        return "Replicate()"


class Partial(Placement):
    """Every rank of the mesh dim holds one term of a pending reduction."""

    __slots__ = ("reduce_op",)

    def __init__(self, reduce_op: str = "sum"):
        if reduce_op not in _REDUCE_OPS:
            raise ValueError(f"Partial(reduce_op={reduce_op!r}): allowed are {', '.join(map(repr, _REDUCE_OPS))}")
        self.reduce_op = reduce_op

    def _arguments(self) -> tuple:
        return (self.reduce_op,)

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return reduce_op is None or reduce_op == self.reduce_op

    def __eq__(self, other):
        return isinstance(other, Partial) and other.reduce_op == self.reduce_op

    def __hash__(self):
        return hash(("partial", self.reduce_op))

    def __repr__(self):
        return f"Partial({self.reduce_op})"


class NormPartial(Partial):
    """A pending p-norm (DTensor's ``_NormPartial``): every rank holds the p-norm of its part, the
    value is the p-norm of those. What a norm over a split dim gives; it reduces as a sum of p-th
    powers. p = 0 and 1 are Partial(sum), +-inf Partial(max) / Partial(min)."""

    __slots__ = ("norm_type",)

    def __init__(self, norm_type: float = 2.0):
        self.reduce_op = "norm"
        self.norm_type = float(norm_type)

    def _arguments(self) -> tuple:
        return (self.norm_type,)

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return reduce_op in (None, "norm")

    def __eq__(self, other):
        return isinstance(other, NormPartial) and other.norm_type == self.norm_type

    def __hash__(self):
        return hash(("norm", self.norm_type))

    def __repr__(self):
        return f"NormPartial(norm_type={self.norm_type:g})"


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
    """Our placements as torch.distributed.tensor's (for to_dtensor)."""
    from torch.distributed.tensor import Partial as TPartial, Replicate as TReplicate, Shard as TShard

    out = []
    for p in placements:
        if isinstance(p, ZigzagShard):
            raise ValueError("to_dtensor: DTensor has no zigzag placement; zigzag_unshard the tensor first")
        if p.is_shard():
            out.append(TShard(p.dim))
        elif p.is_replicate():
            out.append(TReplicate())
        else:
            if p.reduce_op == "product":
                raise ValueError("to_dtensor: DTensor has no Partial(product); redistribute to Replicate first")
            if isinstance(p, NormPartial):
                from torch.distributed.tensor._ops._math_ops import _NormPartial

                out.append(_NormPartial(norm_type=p.norm_type))
                continue
            out.append(TPartial(p.reduce_op))
    return tuple(out)
