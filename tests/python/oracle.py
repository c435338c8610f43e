"""The single-process oracle: what each rank must hold, computed without shardtensor."""

from __future__ import annotations

import torch


def chunk_sizes(size: int, pieces: int) -> list[int]:
    sizes = [len(c) for c in torch.arange(size).chunk(pieces)]
    return sizes + [0] * (pieces - len(sizes))


def piece(global_tensor: torch.Tensor, dim: int, sizes: list[int], index: int) -> torch.Tensor:
    """Piece `index` of `global_tensor` split along `dim` into `sizes`."""
    return global_tensor.narrow(dim, sum(sizes[:index]), sizes[index])


def local_of(global_tensor: torch.Tensor, coordinate, mesh_shape, placements, sizes: dict | None = None):
    """This coordinate's piece of a tensor laid out by `placements` (each tensor dim sharded by at
    most one mesh dim); `sizes` maps tensor dim -> explicit sizes, else torch.chunk sizes."""
    out = global_tensor
    for mesh_dim, p in enumerate(placements):
        if p.is_shard():
            dim = p.dim % global_tensor.dim()
            n = mesh_shape[mesh_dim]
            s = (sizes or {}).get(dim) or chunk_sizes(global_tensor.shape[dim], n)
            out = piece(out, dim, s, coordinate[mesh_dim])
    return out


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, rtol=1e-5, atol=1e-6) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
