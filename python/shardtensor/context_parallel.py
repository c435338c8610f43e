"""Load-balanced causal attention on a split sequence: the zigzag (head-tail) layout.

Under a causal mask the late rows see many keys and the early rows few, so with contiguous
sequence shards the last rank computes about 2n - 1 times as much as the first. The zigzag
layout cuts the sequence into 2n chunks and gives rank r chunks r and 2n - 1 - r::

    q, k, v = (st.zigzag_shard(t, mesh_dim=0, seq_dim=2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    out = st.zigzag_unshard(out, mesh_dim=0, seq_dim=2)

A zigzag tensor's sequence is ``ZigzagShard(seq_dim)``: the order is part of its layout, so causal
attention reads it from q, k and v, with no setting to keep on until the backward has run. It
is still the sequence in order: ``full_tensor()`` and every redistribute give each position where
one process has it, and a replicated operand (a positional buffer) meets it position by
position. Pointwise operators, reductions, matmuls, norms, losses, views and attention keep the
order; any other operator gets its zigzag inputs back in order first (one exchange, with a
one-time warning; an error in strict mode). The C++ API is shardtensor/context_parallel.h.

DTensor's entry point works on plain tensors that every rank holds whole::

    with st.context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # q, k, v: local zigzag pieces
        out.sum().backward()
        whole = st.context_parallel_unshard(mesh, [out], [2])[0]
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import _C
from ._placements import Replicate, Shard, ZigzagShard
from ._tensor import _mesh_or_current, _require, distribute_tensor, from_local


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


# ---- DTensor's context_parallel ---------------------------------------------------------------

def _cp_mesh(mesh, api: str):
    """The 1-D mesh of context parallelism (DTensor requires one), through this rank."""
    if mesh is None:
        raise TypeError(f"{api}: mesh is required (a 1-D DeviceMesh over the context-parallel ranks)")
    mesh = _mesh_or_current(mesh, api)
    if mesh.ndim != 1:
        raise ValueError(f"{api}: expects a 1-D mesh, as DTensor's does, got {mesh}; pass the context-parallel "
                         f"dim of it, mesh['cp']")
    if mesh.get_coordinate() is None:
        raise ValueError(f"{api}: this rank is not in {mesh}; only the mesh's ranks enter it")
    return mesh


def _buffer_problem(index: int, buffer, seq_dim) -> str | None:
    """Why buffer `index` cannot be sharded in place along `seq_dim`, or None."""
    if not isinstance(buffer, torch.Tensor):
        return f"buffer {index} is a {type(buffer).__name__}; buffers are plain torch.Tensors"
    if _C.is_shard_tensor(buffer):
        return (f"buffer {index} is a ShardTensor; context_parallel shards plain tensors that every rank holds "
                f"whole. Pass buffer.full_tensor(), or lay a ShardTensor out with zigzag_shard and zigzag_causal")
    if buffer.requires_grad:
        return (f"buffer {index} requires grad, and torch cannot resize such a tensor in place; pass a detached "
                f"copy (t.detach().clone()) and set its requires_grad = True inside the block, as with DTensor")
    ndim = buffer.dim()
    if isinstance(seq_dim, bool) or not isinstance(seq_dim, int) or ndim == 0 or not -ndim <= seq_dim < ndim:
        return (f"buffer_seq_dims[{index}] = {seq_dim!r} is out of range for buffer {index} of shape "
                f"{tuple(buffer.shape)}: allowed are {-ndim} to {ndim - 1}")
    return None


def _agree(mesh, problem: str | None, layout) -> None:
    """One all-gather of every rank's check and buffer layout: a bad argument on any rank, or
    ranks that disagree, raise ValueError on every rank instead of a hang or a wrong value."""
    gathered = [None] * mesh.size()
    dist.all_gather_object(gathered, (problem, layout), group=mesh.get_group())
    me = mesh.get_local_rank()
    if problem is not None:
        raise ValueError(f"context_parallel: {problem}")
    for rank, (theirs, _) in enumerate(gathered):
        if theirs is not None:
            raise ValueError(f"context_parallel: on rank {rank}: {theirs} (every rank stops)")
    differ = [rank for rank, (_, theirs) in enumerate(gathered) if theirs != layout]
    if differ:
        shown = "; ".join(f"rank {r}: {gathered[r][1]}" for r in sorted({0, me, *differ}))
        raise ValueError(f"context_parallel: the ranks passed different buffers ((shape, seq dim) each: {shown}); "
                         f"every rank passes its whole copy of the same buffers with the same buffer_seq_dims")


class _SequenceLengths:
    """Which global sequence a plain local piece belongs to, from its length.

    A piece's length is the zigzag size of its sequence on this rank, which two buffers of
    different lengths can share on some rank. The answer must be alike on every rank (a rank
    that refuses while the others enter the ring would leave them waiting), so a length whose
    sequence shares a size on any rank with another buffer's is refused on every rank."""

    def __init__(self, lengths, ranks: int, me: int):
        self.sizes = {length: zigzag_shard_sizes(length, ranks) for length in sorted(set(lengths))}
        self.me = me
        self.confusable = {a: [b for b in self.sizes if b != a and any(x == y for x, y in zip(self.sizes[a], self.sizes[b]))]
                           for a in self.sizes}

    def global_length(self, local: int, what: str) -> int:
        found = [length for length, sizes in self.sizes.items() if sizes[self.me] == local]
        if not found:
            pieces = ", ".join(f"{sizes[self.me]} (of {length})" for length, sizes in self.sizes.items()) or "none: no buffers"
            raise ValueError(f"context_parallel: scaled_dot_product_attention got a {what} of sequence length {local} "
                             f"on rank {self.me}, which is no sharded buffer's piece here (local lengths: {pieces}). "
                             f"Inside context_parallel, SDPA expects sequence pieces of the sharded buffers (dim -2 "
                             f"of query, key and value); add the tensor they come from to `buffers`")
        if len(found) > 1 or self.confusable[found[0]]:
            clash = sorted(set(found) | set(self.confusable[found[0]]))
            raise ValueError(f"context_parallel: scaled_dot_product_attention cannot tell which sequence its {what} "
                             f"of local length {local} is a piece of: buffers of lengths {clash} give some rank pieces "
                             f"of the same length. Give the buffers one sequence length, or lay them out with "
                             f"zigzag_shard and call SDPA on ShardTensors")
        return found[0]


def _attention_on_pieces(mesh, lengths: _SequenceLengths, previous):
    """scaled_dot_product_attention that reads plain tensors as this rank's zigzag pieces."""

    def scaled_dot_product_attention(query, key, value, *args, **kwargs):
        tensors = (query, key, value)
        if not all(isinstance(t, torch.Tensor) for t in tensors) or any(_C.is_shard_tensor(t) for t in tensors):
            return previous(query, key, value, *args, **kwargs)
        if (args[0] if args else kwargs.get("attn_mask")) is not None:
            raise ValueError("context_parallel: scaled_dot_product_attention on sequence pieces takes is_causal, not "
                             "attn_mask (as DTensor's); for a mask, make ShardTensors of query, key, value and mask")
        pieces = []
        for t, what in zip(tensors, ("query", "key", "value")):
            if t.dim() < 2:
                raise ValueError(f"context_parallel: scaled_dot_product_attention's {what} has shape {tuple(t.shape)}; "
                                 f"it needs (..., sequence, embedding)")
            seq_dim = t.dim() - 2
            try:
                sizes = lengths.sizes[lengths.global_length(t.shape[seq_dim], what)]
            except ValueError:
                # Other ranks may have found their pieces and wait in from_local's agreement
                # gather: sizes that cannot hold this piece fail it there, on every rank.
                unholdable = [0] * mesh.size()
                unholdable[lengths.me] = t.shape[seq_dim] + 1
                with contextlib.suppress(ValueError):
                    from_local(t, mesh, [Shard(seq_dim)], sharding_shapes={seq_dim: unholdable})
                raise
            try:
                pieces.append(from_local(t, mesh, [ZigzagShard(seq_dim)], sharding_shapes={seq_dim: sizes}))
            except ValueError as e:
                raise ValueError(f"context_parallel: scaled_dot_product_attention could not take its {what} as a "
                                 f"sequence piece (a rank whose {what} is no buffer's piece stops every rank here): "
                                 f"{e}") from None
        return previous(*pieces, *args, **kwargs).to_local()

    return scaled_dot_product_attention


@contextlib.contextmanager
def context_parallel(mesh, *, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
    """DTensor's context_parallel: within the block, each buffer holds this rank's zigzag piece of
    its sequence, and F.scaled_dot_product_attention on plain pieces runs the ring.

    On entry each buffer (a plain tensor every rank holds whole: inputs, labels, positional
    buffers) is cut in place along its ``buffer_seq_dims`` entry into rank r's chunks r and
    2n - 1 - r of 2n (``zigzag_shard``'s layout, any length). F.scaled_dot_product_attention on
    plain tensors (sequence on dim -2) reads them as zigzag pieces of the buffer of that local
    length, runs ring attention with the zigzag causal mask and returns this rank's piece. On exit every buffer not in
    ``no_restore_buffers`` (by identity) gets its content back. Entry costs one small
    all-gather that checks every rank passed the same buffer shapes and seq dims.
    """
    mesh = _cp_mesh(mesh, "context_parallel")
    buffers = [] if buffers is None else list(buffers)
    seq_dims = [] if buffer_seq_dims is None else list(buffer_seq_dims)
    keep = [] if no_restore_buffers is None else list(no_restore_buffers)
    problem = None
    if len(buffers) != len(seq_dims):
        problem = (f"buffers has {len(buffers)} entries and buffer_seq_dims {len(seq_dims)}; give one sequence dim "
                   f"per buffer")
    elif any(not any(b is x for x in buffers) for b in keep):
        problem = "no_restore_buffers must be a subset of buffers (compared by identity)"
    else:
        problem = next((p for p in (_buffer_problem(i, b, d) for i, (b, d) in enumerate(zip(buffers, seq_dims))) if p), None)
    layout = None if problem else [(tuple(b.shape), d % b.dim()) for b, d in zip(buffers, seq_dims)]
    _agree(mesh, problem, layout)
    seq_dims = [d for _, d in layout]

    originals = [None if any(b is x for x in keep) else b.clone() for b in buffers]
    lengths = _SequenceLengths([b.shape[d] for b, d in zip(buffers, seq_dims)], mesh.size(), mesh.get_local_rank())
    previous = F.scaled_dot_product_attention
    try:
        with torch.no_grad():
            for b, d in zip(buffers, seq_dims):
                # Cut from a replicated tensor: no message; zigzag_shard owns the layout.
                piece = zigzag_shard(distribute_tensor(b, mesh, [Replicate()], src_data_rank=None), 0, d).to_local()
                if piece.untyped_storage().data_ptr() == b.untyped_storage().data_ptr():
                    piece = piece.clone()
                b.resize_(piece.shape)
                b.copy_(piece)
        F.scaled_dot_product_attention = _attention_on_pieces(mesh, lengths, previous)
        yield
    finally:
        F.scaled_dot_product_attention = previous
        with torch.no_grad():
            for b, original in zip(buffers, originals):
                if original is None:
                    continue
                regrad = b.requires_grad and b.is_leaf  # set inside the block, as in DTensor's usage
                if regrad:
                    b.requires_grad_(False)
                b.resize_(original.shape)
                b.copy_(original)
                if regrad:
                    b.requires_grad_(True)


@torch.no_grad()
def context_parallel_unshard(mesh, buffers, seq_dims) -> list:
    """DTensor's companion of ``context_parallel``: the whole tensors, in sequence order and alike on
    every rank, of zigzag pieces computed inside the block (the attention output, a gradient,
    per-position losses). One all-gather of the pieces' lengths, then one of each buffer."""
    mesh = _cp_mesh(mesh, "context_parallel_unshard")
    buffers, seq_dims = list(buffers), list(seq_dims)
    if len(buffers) != len(seq_dims):
        raise ValueError(f"context_parallel_unshard: buffers has {len(buffers)} entries and seq_dims {len(seq_dims)}; "
                         f"give one sequence dim per buffer")
    n, whole = mesh.size(), []
    for i, (b, d) in enumerate(zip(buffers, seq_dims)):
        if not isinstance(b, torch.Tensor) or _C.is_shard_tensor(b):
            kind = "ShardTensor" if isinstance(b, torch.Tensor) else type(b).__name__
            raise ValueError(f"context_parallel_unshard: buffer {i} is a {kind}; it takes this rank's plain zigzag pieces")
        if isinstance(d, bool) or not isinstance(d, int) or b.dim() == 0 or not -b.dim() <= d < b.dim():
            raise ValueError(f"context_parallel_unshard: seq_dims[{i}] = {d!r} is out of range for buffer {i} of shape "
                             f"{tuple(b.shape)}: allowed are {-b.dim()} to {b.dim() - 1}")
        d %= b.dim()
        x = from_local(b, mesh, [Shard(d)], sharding_shapes="infer")
        sizes = x.shard_sizes()[d]
        expected = zigzag_shard_sizes(sum(sizes), n)
        if sizes != expected:
            raise ValueError(f"context_parallel_unshard: buffer {i}'s pieces along dim {d} have lengths {sizes} over the "
                             f"ranks, but zigzag pieces of a sequence of {sum(sizes)} have {expected}; pass pieces "
                             f"computed inside context_parallel")
        whole.append(from_local(b, mesh, [ZigzagShard(d)], sharding_shapes={d: sizes}).full_tensor())
    return whole
