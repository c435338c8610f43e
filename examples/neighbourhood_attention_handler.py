"""A domain-parallel operator that no sharding rule covers, added from Python as a PhysicsNeMo
user adds one: a function handler.

``natten1d`` is 1-D neighbourhood attention: position i attends to the keys at positions
i - window ... i + window (those inside the sequence). Written for whole sequences, it reads
neighbours through F.pad and unfold. On a sequence split over ranks each rank needs `window`
keys and values from its neighbours on each side: a halo. The handler gets them with
``redistribute``: each shifted copy of the keys, re-laid-out as the queries are, moves only
the positions that cross a boundary (any split works, pieces shorter than the window and empty
ones too), and the rest is local. Gradients flow through redistribute, to_local and from_local.

    shardrun -n 4 .venv/bin/python examples/neighbourhood_attention_handler.py

prints the largest difference from one process (values and gradients) on every rank.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import shardtensor as st
from shardtensor import ShardTensor


def natten1d(q, k, v, window: int):
    """q, k, v: (batch, length, dim). Attention over each position's neighbourhood."""
    length = q.shape[1]
    keys = F.pad(k, (0, 0, window, window)).unfold(1, 2 * window + 1, 1)      # (B, L, D, 2w + 1)
    values = F.pad(v, (0, 0, window, window)).unfold(1, 2 * window + 1, 1)
    positions = torch.arange(length).unsqueeze(1) + torch.arange(-window, window + 1)
    inside = (positions >= 0) & (positions < length)                           # (L, 2w + 1)
    return _attend(q, keys, values, inside)


def _attend(q, keys, values, inside):
    scores = torch.einsum("bld,bldw->blw", q, keys) / math.sqrt(q.shape[-1])
    weights = scores.masked_fill(~inside, float("-inf")).softmax(-1)
    return torch.einsum("blw,bldw->bld", weights, values)


def _shifted(x, shift: int, like):
    """x[:, i + shift] at every position i (zero outside), laid out like `like`: the halo."""
    length = x.shape[1]
    padded = F.pad(x, (0, 0, abs(shift), abs(shift)))
    moved = padded[:, abs(shift) + shift:abs(shift) + shift + length]
    return moved.redistribute(like.device_mesh, like.placements, sharding_shapes=like.shard_sizes())


def natten1d_on_shards(func, types, args, kwargs):
    """natten1d on ShardTensors whose sequence (dim 1) is split over a 1-d mesh."""
    q, k, v, window = (*args, *kwargs.values())
    if q.placements != (st.Shard(1),):
        return func(q.full_tensor(), k.full_tensor(), v.full_tensor(), window)  # not the split this handler knows
    k, v = (t.redistribute(q.device_mesh, q.placements, sharding_shapes=q.shard_sizes()) for t in (k, v))
    shifts = range(-window, window + 1)
    keys = torch.stack([_shifted(k, s, q).to_local() for s in shifts], -1)
    values = torch.stack([_shifted(v, s, q).to_local() for s in shifts], -1)
    start, local_length = q.offsets(0), q.to_local().shape[1]
    positions = torch.arange(start, start + local_length).unsqueeze(1) + torch.arange(-window, window + 1)
    inside = (positions >= 0) & (positions < q.shape[1])
    out = _attend(q.to_local(), keys, values, inside)
    return ShardTensor.from_local(out, q.device_mesh, q.placements, sharding_shapes=q.sharding_shapes())


ShardTensor.register_function_handler(natten1d, natten1d_on_shards)


def main():
    mesh = st.init_device_mesh("cpu", (st._C.world_size(),))
    n = mesh.size()
    torch.manual_seed(0)
    length, window = 17, 3
    q, k, v = (torch.randn(2, length, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = natten1d(q, k, v, window)
    out.square().sum().backward()

    sizes = [length - 2 * (n - 1)] + [2] * (n - 1) if n > 1 else [length]  # short pieces: shorter than the window
    shards = [st.distribute_tensor(t.detach(), mesh, [st.Shard(1)], sharding_shapes={1: sizes}).requires_grad_()
              for t in (q, k, v)]
    sharded = natten1d(*shards, window)
    sharded.square().sum().backward()
    worst = max((sharded.full_tensor() - out).abs().max().item(),
                *((s.grad.full_tensor() - t.grad).abs().max().item() for s, t in zip(shards, (q, k, v))))
    print(f"rank {mesh.get_rank()}: pieces {sizes}, largest difference from one process {worst:.1e}")
    assert worst < 1e-12


if __name__ == "__main__":
    main()
