"""Factories that never materialise the global tensor: each rank fills only its piece.

Without a dtype every factory makes torch's default dtype (float32 unless
torch.set_default_dtype changed it), as torch's do; full() follows its fill value as torch.full.
Random factories are sharding-invariant: with the same seed the global tensor is the same
whatever the mesh, placements or shard sizes (a counter-based generator indexed by each
element's global position), so a Replicate tensor holds the same values on every rank.
"""

from __future__ import annotations

import torch

from . import _C, _placements
from ._tensor import _encode_sizes, _mesh_and_placements


def _make(kind, size, device_mesh, placements, dtype, requires_grad, sharding_shapes, value=0.0, seed=None):
    shape = list(size[0]) if len(size) == 1 and not isinstance(size[0], int) else list(size)
    mesh, encoded = _mesh_and_placements(device_mesh, placements, kind)
    sizes = _encode_sizes(sharding_shapes, _placements.decode(encoded), mesh)
    return _C.factory(kind, [int(s) for s in shape], mesh._cpp, encoded, dtype, requires_grad, sizes, float(value), seed)


def empty(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False, sharding_shapes=None):
    return _make("empty", size, device_mesh, placements, dtype, requires_grad, sharding_shapes)


def zeros(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False, sharding_shapes=None):
    return _make("zeros", size, device_mesh, placements, dtype, requires_grad, sharding_shapes)


def ones(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False, sharding_shapes=None):
    return _make("ones", size, device_mesh, placements, dtype, requires_grad, sharding_shapes)


def full(size, fill_value, *, device_mesh=None, placements=None, dtype=None, requires_grad=False, sharding_shapes=None):
    """As torch.full: without a dtype, a bool fill gives torch.bool, an int fill torch.int64,
    and a float fill torch's default dtype."""
    if dtype is None and isinstance(fill_value, bool):
        dtype = torch.bool
    elif dtype is None and isinstance(fill_value, int):
        dtype = torch.int64
    return _make("full", (size,), device_mesh, placements, dtype, requires_grad, sharding_shapes, value=fill_value)


def rand(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False, sharding_shapes=None, seed=None):
    return _make("rand", size, device_mesh, placements, dtype, requires_grad, sharding_shapes, seed=seed)


def randn(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False, sharding_shapes=None, seed=None):
    return _make("randn", size, device_mesh, placements, dtype, requires_grad, sharding_shapes, seed=seed)


def manual_seed(seed: int, device_mesh=None) -> None:
    """Gives shardtensor's random factories and random ops their own seed. Until it is called
    they draw their keys from torch's default generator (torch.manual_seed decides them); from
    then on, from this seed. Every rank must pass the same seed: with `device_mesh` the ranks
    of that mesh check it now (one small all-gather), as DTensor's manual_seed does; without
    it, the first random draw on each mesh checks it. Either way a rank-dependent seed raises
    on every rank."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"manual_seed: seed must be a non-negative int, got {seed!r}")
    if device_mesh is None:
        _C.manual_seed(seed)
    else:
        _C.manual_seed_over(seed, device_mesh._cpp)
