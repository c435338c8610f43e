"""A llama model trained tensor- and sequence-parallel with torchtitan's classic plan, written
as DTensor's users write it: only the imports name shardtensor. Sizes the mesh does not divide
work (a sequence of 13, a vocabulary of 37, a feed-forward width of 22, 3 heads); rank 0 trains
the same model on one process beside it and prints both losses.

    shardrun -n 4 .venv/bin/python examples/llama_tensor_parallel.py            4 ranks
    .venv/bin/torchrun --nproc-per-node 3 examples/llama_tensor_parallel.py

The model is torchtitan's llama3 in miniature: token embedding, per layer RMSNorm, attention
with grouped-query heads and rotary positions, RMSNorm and a SwiGLU feed-forward, then a final
RMSNorm, the output projection and cross-entropy under loss_parallel (the vocabulary stays
split). tests/python/test_llama_block.py and bench/tp_block_bench.py use these definitions.
"""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn


def rotary(seqlen, head_dim, theta=10000.0, dtype=torch.float64):
    """cos and sin of the rotary angles, [seqlen, head_dim] (the rotate-half form)."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seqlen, dtype=torch.float64), freqs)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x, cos, sin):
    """x: [batch, sequence, heads, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def repeat_kv(x, n_rep):
    """torchtitan's repeat_kv: each key/value head serves n_rep query heads."""
    bs, seqlen, n_kv, head_dim = x.shape
    return x[:, :, :, None, :].expand(bs, seqlen, n_kv, n_rep, head_dim).reshape(bs, seqlen, -1, head_dim)


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads):
        super().__init__()
        self.head_dim = dim // n_heads
        self.n_rep = n_heads // n_kv_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        bs, seqlen, _ = x.shape
        # -1: the heads this rank holds (local tensors, as torchtitan runs), or all (ShardTensors).
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary(xq, cos, sin), apply_rotary(xk, cos, sin)
        xk, xv = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, hidden):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim, eps=1e-6)
        self.attention = Attention(dim, n_heads, n_kv_heads)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-6)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, vocab, dim, n_heads, n_kv_heads, hidden, n_layers, seqlen):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): Block(dim, n_heads, n_kv_heads, hidden) for i in range(n_layers)})
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.output = nn.Linear(dim, vocab, bias=False)
        cos, sin = rotary(seqlen, dim // n_heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.cos, self.sin)
        return self.output(self.norm(h))


def block_plan(parallel, tensor, local_heads=True):
    """torchtitan's per-layer plan (apply_tp in torchtitan/models/llama3/parallelize.py), in the
    names of `parallel` (shardtensor.parallel or torch.distributed.tensor.parallel) and `tensor`
    (shardtensor or torch.distributed.tensor, for Shard and Replicate). local_heads=False keeps
    the q/k/v projections' outputs ShardTensors, so that the head views take the global head
    count: what a head count the mesh does not divide needs (a local view needs whole heads)."""
    Shard, Replicate = tensor.Shard, tensor.Replicate
    return {
        "attention_norm": parallel.SequenceParallel(),
        "attention": parallel.PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                 desired_input_layouts=(Replicate(), None, None)),
        "attention.wq": parallel.ColwiseParallel(use_local_output=local_heads),
        "attention.wk": parallel.ColwiseParallel(use_local_output=local_heads),
        "attention.wv": parallel.ColwiseParallel(use_local_output=local_heads),
        "attention.wo": parallel.RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": parallel.SequenceParallel(),
        "feed_forward": parallel.PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": parallel.ColwiseParallel(),
        "feed_forward.w2": parallel.RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": parallel.ColwiseParallel(),
    }


def parallelize(model, mesh, local_heads=True):
    """torchtitan's classic plan with SequenceParallel and loss_parallel, on shardtensor."""
    import shardtensor
    from shardtensor import parallel

    parallel.parallelize_module(model, mesh, {
        "tok_embeddings": parallel.RowwiseParallel(input_layouts=shardtensor.Replicate(),
                                                   output_layouts=shardtensor.Shard(1)),
        "norm": parallel.SequenceParallel(),
        "output": parallel.ColwiseParallel(input_layouts=shardtensor.Shard(1), output_layouts=shardtensor.Shard(-1),
                                           use_local_output=False),
    })
    for block in model.layers.values():
        parallel.parallelize_module(block, mesh, block_plan(parallel, shardtensor, local_heads))
    return model


def main() -> int:
    import shardtensor as st
    from shardtensor.parallel import loss_parallel

    world = int(os.environ.get("WORLD_SIZE", "1"))
    mesh = st.init_device_mesh("cpu", (world,))
    root = mesh.get_rank() == 0
    vocab, dim, heads, kv_heads, hidden, layers, seqlen = 37, 12, 3, 1, 22, 2, 13
    torch.manual_seed(0)
    single = Llama(vocab, dim, heads, kv_heads, hidden, layers, seqlen).double()
    model = parallelize(copy.deepcopy(single), mesh, local_heads=heads % world == 0 and kv_heads % world == 0)
    opt, single_opt = torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.AdamW(single.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(1)  # the same batches on every rank
    worst = 0.0
    for step in range(10):
        tokens = torch.randint(0, vocab, (4, seqlen), generator=data)
        labels = torch.roll(tokens, -1, dims=1)
        opt.zero_grad()
        with loss_parallel():
            loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten(0, 1))
            loss.backward()
        opt.step()
        single_opt.zero_grad()
        expected = F.cross_entropy(single(tokens).flatten(0, 1), labels.flatten(0, 1))
        expected.backward()
        single_opt.step()
        value = loss.full_tensor().item()
        worst = max(worst, abs(value - expected.item()) / abs(expected.item()))
        if root:
            print(f"step {step}: loss {value:.6f}, one process {expected.item():.6f}")
    if root:
        print(f"largest relative difference: {worst:.2e}")
    return 0 if worst < 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
