"""Load-balanced causal attention on a split sequence: the zigzag (head-tail) layout.

Under a causal mask the late rows see many keys and the early rows few, so with contiguous
sequence shards the last rank computes about 2n - 1 times as much as the first. The zigzag
layout cuts the sequence into 2n chunks and gives rank r chunks r and 2n - 1 - r::

    q, k, v = (st.zigzag_shard(t, mesh_dim=0, seq_dim=2) for t in (q, k, v))
    with st.zigzag_causal(mesh, mesh_dim=0):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        loss = ...
        loss.backward()                      # inside too: the backward reads the same setting
    out = st.zigzag_unshard(out, mesh_dim=0, seq_dim=2)

A zigzag tensor is an ordinary ShardTensor (Shard(seq_dim) in ``zigzag_shard_sizes``) whose
global tensor is the sequence in permuted order. Position-blind operators (pointwise, linear,
layer norm, a loss averaged over positions) compute on it as on any tensor; causal attention
reads the original positions while the setting is on. The setting is process-wide, like
DTensor's context_parallel load balancing, because autograd may run the backward on another
thread. The C++ API is shardtensor/context_parallel.h.
"""
from __future__ import annotations

import contextlib

from . import _C
from ._tensor import _require


def zigzag_shard(t, mesh_dim: int = 0, seq_dim: int = 2):
    """``t`` with its sequence (dim ``seq_dim``) as zigzag chunks along ``mesh_dim``.

    A sequence replicated along the mesh dim is cut locally, with no message; a split one moves
    in one message batch. Other mesh dims keep their placements. Differentiable.
    """
    _require(t, "zigzag_shard")
    return _C.zigzag_shard(t, int(mesh_dim), int(seq_dim))


def zigzag_unshard(t, mesh_dim: int = 0, seq_dim: int = 2):
    """The inverse of ``zigzag_shard``: the sequence in order, Shard(seq_dim) with torch.chunk sizes."""
    _require(t, "zigzag_unshard")
    return _C.zigzag_unshard(t, int(mesh_dim), int(seq_dim))


def zigzag_shard_sizes(length: int, ranks: int) -> list[int]:
    """Each rank's shard size under zigzag: its early chunk plus its late one."""
    return list(_C.zigzag_shard_sizes(int(length), int(ranks)))


def set_zigzag_causal(mesh, mesh_dim: int, on: bool) -> None:
    """Whether causal attention reads sequence shards along ``mesh_dim`` as zigzag chunks."""
    _C.set_zigzag_causal(mesh._cpp, int(mesh_dim), bool(on))


@contextlib.contextmanager
def zigzag_causal(mesh, mesh_dim: int = 0):
    """Within the block (process-wide), causal attention along ``mesh_dim`` reads zigzag chunks."""
    previous = _C.zigzag_causal(mesh._cpp, int(mesh_dim))
    _C.set_zigzag_causal(mesh._cpp, int(mesh_dim), True)
    try:
        yield
    finally:
        _C.set_zigzag_causal(mesh._cpp, int(mesh_dim), previous)
