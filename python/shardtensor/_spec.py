"""PhysicsNeMo's view of a ShardTensor's layout: ``x._spec``, ``x.sharding_shapes()`` and
``x.offsets()``, keyed by *mesh dim* as PhysicsNeMo's ShardTensorSpec keys them.

Everything here is computed from the C++ spec, which knows every rank's piece without
communicating: no call in this module issues a collective (PhysicsNeMo's may all-gather shapes
the first time).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _C, _placements
from ._mesh import mesh_of_cpp


class TensorMeta(NamedTuple):
    """The global tensor's metadata, DTensor's TensorMeta fields."""

    shape: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype


class ShardTensorSpec:
    """The layout of one ShardTensor (PhysicsNeMo's ``ShardTensorSpec``, a ``DTensorSpec``).

    ``sharding_shapes()`` maps each mesh dim that shards a tensor dim to the local shapes of the
    ranks along that mesh dim (this rank's group on it), in group order; ``offsets()`` gives,
    per mesh dim, where this rank's piece starts along the tensor dim that mesh dim shards.
    """

    def __init__(self, t: torch.Tensor):
        self._t = t
        self.mesh = mesh_of_cpp(_C.mesh(t))
        self.placements = _placements.decode(_C.placements(t))
        self.tensor_meta = TensorMeta(t.shape, tuple(t.stride()), t.dtype)

    @property
    def shape(self) -> torch.Size:
        return self.tensor_meta.shape

    @property
    def stride(self) -> tuple[int, ...]:
        return self.tensor_meta.stride

    @property
    def ndim(self) -> int:
        return len(self.tensor_meta.shape)

    @property
    def device_mesh(self):
        return self.mesh

    @property
    def num_shards(self) -> int:
        n = 1
        for d, p in enumerate(self.placements):
            if p.is_shard():
                n *= self.mesh.size(d)
        return n

    @property
    def local_shape(self) -> torch.Size:
        return torch.Size(_C.local_shape(self._t))

    def _coordinate(self) -> list[int]:
        coordinate = self.mesh.get_coordinate()
        if coordinate is None:
            raise ValueError(f"this rank ({self.mesh.get_rank()}) is not in {self.mesh}; its ShardTensors hold no piece, "
                             "so they have no sharding shapes or offsets")
        return coordinate

    def _sharding_mesh_dim(self, mesh_dim: int, what: str) -> int:
        if isinstance(mesh_dim, bool) or not isinstance(mesh_dim, int) or not -self.mesh.ndim <= mesh_dim < self.mesh.ndim:
            raise ValueError(f"{what}: mesh_dim={mesh_dim!r} is not a dim of {self.mesh} (0 to {self.mesh.ndim - 1})")
        return mesh_dim % self.mesh.ndim

    def sharding_shapes(self, mesh_dim: int | None = None):
        """{mesh dim: (local shape of each rank along it, ...)} for the mesh dims that shard, or
        the tuple of one mesh dim. Shapes are tuples of ints, as in PhysicsNeMo."""
        coordinate = self._coordinate()
        shapes = {}
        for d, p in enumerate(self.placements):
            if not p.is_shard():
                continue
            along = []
            for j in range(self.mesh.size(d)):
                at = list(coordinate)
                at[d] = j
                along.append(tuple(_C.local_shape_at(self._t, at)))
            shapes[d] = tuple(along)
        if mesh_dim is None:
            return shapes
        d = self._sharding_mesh_dim(mesh_dim, "sharding_shapes")
        if d not in shapes:
            raise ValueError(f"sharding_shapes: mesh dim {mesh_dim} does not shard this tensor (placements "
                             f"{list(self.placements)}); the mesh dims that do: {sorted(shapes)}")
        return shapes[d]

    def offsets(self, mesh_dim: int | None = None):
        """Per mesh dim, the start of this rank's piece along the tensor dim it shards (0 where
        the mesh dim does not shard), among the pieces of its group on that mesh dim; with
        ``mesh_dim``, that one offset."""
        coordinate = self._coordinate()
        shapes = self.sharding_shapes()
        result = []
        for d, p in enumerate(self.placements):
            result.append(sum(s[p.dim] for s in shapes[d][: coordinate[d]]) if p.is_shard() else 0)
        if mesh_dim is None:
            return tuple(result)
        return result[self._sharding_mesh_dim(mesh_dim, "offsets")]

    def __eq__(self, other):
        return (isinstance(other, ShardTensorSpec) and self.mesh == other.mesh and self.placements == other.placements
                and self.tensor_meta == other.tensor_meta
                and _C.shard_sizes(self._t) == _C.shard_sizes(other._t))

    __hash__ = None  # a view of one tensor's layout; compare it, do not key dicts by it

    def __repr__(self):
        return (f"ShardTensorSpec(mesh={self.mesh}, placements={list(self.placements)}, shape={list(self.shape)}, "
                f"sharding_shapes={self.sharding_shapes() if self.mesh.get_coordinate() is not None else None})")
