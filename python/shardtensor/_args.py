"""Argument helpers that the eager ShardTensor API (_tensor.py) and its traced form
(_traceable.py) share: which mesh a call means, and explicit shard sizes as the C++ layer takes
them. A leaf: it imports neither."""

from __future__ import annotations

from . import _mesh
from ._mesh import DeviceMesh, from_torch_mesh


def _mesh_or_current(device_mesh, what: str) -> DeviceMesh:
    """The mesh a call means: the one given (torch's own DeviceMesh too), else the current one
    (_mesh.current_mesh: the innermost `with mesh:`, else the mesh the program built last)."""
    if device_mesh is None:
        current = _mesh.current_mesh()
        if current is None:
            raise ValueError(f"{what}: no device_mesh given, no `with mesh:` is active and none has been created; "
                             f"call init_device_mesh first")
        return current
    if not isinstance(device_mesh, DeviceMesh):
        if type(device_mesh).__name__ == "DeviceMesh":  # torch's own
            return from_torch_mesh(device_mesh)
        raise TypeError(f"{what}: device_mesh must be a shardtensor.DeviceMesh, got {type(device_mesh).__name__}")
    return device_mesh


def _encode_sizes(sizes, placements, mesh: DeviceMesh):
    """Explicit shard sizes as the C++ layer takes them: [(tensor dim, sizes)].

    Two spellings are accepted:
      {tensor_dim: [size per piece, ...]}            shardtensor's, e.g. {0: [1, 4, 2, 3]}
      {mesh_dim: [local shape per rank, ...]}        PhysicsNeMo's sharding_shapes
    """
    if sizes is None:
        return None
    if not isinstance(sizes, dict):
        raise TypeError(f"shard sizes must be a dict, got {type(sizes).__name__}")
    out = []
    placements = tuple(placements)
    for key, values in sizes.items():
        values = list(values)
        if values and not isinstance(values[0], int):  # PhysicsNeMo: per-rank shapes along a mesh dim
            if not (0 <= key < len(placements)) or not placements[key].is_shard():
                raise ValueError(f"sharding_shapes: mesh dim {key} does not shard a tensor dim "
                                 f"(placements {list(placements)})")
            dim = placements[key].dim
            out.append((dim, [int(tuple(s)[dim]) for s in values]))
        else:
            out.append((int(key), [int(v) for v in values]))
    return out
