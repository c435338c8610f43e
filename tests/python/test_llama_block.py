"""A llama-style model (token embedding, RMSNorm, attention with grouped-query heads and rotary
positions, SwiGLU feed-forward, output projection, cross-entropy) under torchtitan's classic
tensor-parallel plan with SequenceParallel and loss_parallel, written as torchtitan writes it,
against the same model on one process: the loss and every parameter's gradient, then two SGD
steps. On sizes the mesh divides, and on sizes it does not (a sequence of 13, a vocabulary of 37,
a feed-forward width of 22, 3 heads), with empty pieces at 4 ranks."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from oracle import assert_close
from ranks import run_ranks

TOL = dict(rtol=1e-9, atol=1e-11)


def rotary(seqlen, head_dim, theta=10000.0):
    """cos and sin of the rotary angles, [seqlen, head_dim] (rotate-half form)."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seqlen, dtype=torch.float64), freqs)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


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
        # -1: the heads this rank holds (torchtitan's local tensors), or all of them (ShardTensors).
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary(xq, cos, sin), apply_rotary(xk, cos, sin)
        # torchtitan's repeat_kv: each key/value head serves n_rep query heads.
        xk = xk[:, :, :, None, :].expand(bs, seqlen, xk.shape[2], self.n_rep, self.head_dim).reshape(
            bs, seqlen, -1, self.head_dim)
        xv = xv[:, :, :, None, :].expand(bs, seqlen, xv.shape[2], self.n_rep, self.head_dim).reshape(
            bs, seqlen, -1, self.head_dim)
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


def torchtitan_plan(model, mesh, local_heads: bool):
    """torchtitan's classic plan (apply_tp in torchtitan/models/llama3/parallelize.py) with
    SequenceParallel and loss_parallel. local_heads=False keeps the q/k/v projections'
    outputs ShardTensors, so that the head views take the global head count: what a head
    count the mesh does not divide needs (torchtitan's local views need whole heads per rank)."""
    from shardtensor import Replicate, Shard
    from shardtensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                      parallelize_module)

    parallelize_module(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for block in model.layers.values():
        parallelize_module(block, mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "attention.wq": ColwiseParallel(use_local_output=local_heads),
            "attention.wk": ColwiseParallel(use_local_output=local_heads),
            "attention.wv": ColwiseParallel(use_local_output=local_heads),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })
    return model


CONFIGS = {
    # vocab, dim, heads, kv heads, ffn width, layers, sequence
    "even": (32, 16, 4, 2, 32, 2, 8),
    "uneven": (37, 12, 3, 1, 22, 2, 13),
}


def llama_body(rank, world_size, config):
    import shardtensor as st
    from shardtensor.parallel import loss_parallel

    vocab, dim, heads, kv_heads, hidden, layers, seqlen = CONFIGS[config]
    local_heads = config == "even" and heads % world_size == 0 and kv_heads % world_size == 0
    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    single = Llama(vocab, dim, heads, kv_heads, hidden, layers, seqlen).double()
    model = torchtitan_plan(copy.deepcopy(single), mesh, local_heads)
    tokens = torch.randint(0, vocab, (2, seqlen))
    labels = torch.randint(0, vocab, (2, seqlen))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1)
    for step in range(2):
        what = f"{config} sizes, {world_size} ranks, step {step}"
        opt.zero_grad()
        single_opt.zero_grad()
        pred = model(tokens)
        with loss_parallel():
            loss = F.cross_entropy(pred.flatten(0, 1), labels.flatten(0, 1))
            loss.backward()
        expected = F.cross_entropy(single(tokens).flatten(0, 1), labels.flatten(0, 1))
        expected.backward()
        assert_close(loss.full_tensor(), expected.detach(), f"{what}: loss", **TOL)
        for (name, p), q in zip(model.named_parameters(), single.parameters()):
            grad = p.grad.full_tensor() if st.is_shard_tensor(p.grad) else p.grad
            assert_close(grad, q.grad, f"{what}: gradient of {name}", **TOL)
        opt.step()
        single_opt.step()
    for (name, p), q in zip(model.named_parameters(), single.parameters()):
        assert_close(p.detach().full_tensor(), q.detach(), f"{config}: {name} after two steps", **TOL)


def all_bodies(rank, world_size):
    for config in CONFIGS:
        llama_body(rank, world_size, config)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_llama_block_under_torchtitans_plan_matches_one_process(world_size):
    run_ranks(all_bodies, world_size, timeout=400)
