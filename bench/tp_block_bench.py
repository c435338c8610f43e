"""A tensor-parallel transformer-block training step three ways, in turns, in one run:
the hand-written torch.distributed program, shardtensor through parallelize_module, and torch's
DTensor through its own parallelize_module with the same plan. Results: bench/RESULTS.md.

    .venv/bin/shardrun -n 2 .venv/bin/python bench/tp_block_bench.py [--json FILE] [--steps N]

The block is llama's (RMSNorm, causal attention, SwiGLU feed-forward, both residuals) under
torchtitan's classic plan with sequence parallelism: the block's input and output are split
over the sequence, each norm runs on its sequence piece, the attention and the feed-forward
gather the sequence (all-gather), compute on this rank's heads and hidden columns, and scatter
their sums back over the sequence (reduce-scatter). One step: forward, the mean square of the
output as the loss, backward, SGD.

The hand-written program does exactly that on local tensors: all_gather_into_tensor and
reduce_scatter_tensor in autograd functions that swap them in backward, and one all-reduce per
norm weight (their gradients are partial over the sequence). Sizes: a small block, where
per-op cost shows, and a larger one, where compute does; both divide over the ranks (DTensor
needs it). Each step's time is the slowest rank's; the three programs take turns, a barrier
before each step. Before timing, one step of each from the same weights is checked against the
hand-written one (loss and updated weights), so nothing wrong gets timed.
"""

import argparse
import copy
import gc
import json
import platform
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import shardtensor as st

SIZES = {  # batch, sequence, dim, heads, feed-forward width
    "small": (2, 16, 32, 4, 64),
    "large": (4, 256, 256, 8, 768),
}
BAR_HAND = 1.05
BAR_DTENSOR = 0.5
LR = 1e-2


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        bs, seqlen, _ = x.shape
        q = self.wq(x).view(bs, seqlen, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bs, seqlen, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
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
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim, eps=1e-6)
        self.attention = Attention(dim, heads)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-6)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def block_plan(lib):
    """torchtitan's per-layer plan (apply_tp), in `lib`'s names (shardtensor's or torch's)."""
    p = lib
    return {
        "attention_norm": p.SequenceParallel(),
        "attention": p.PrepareModuleInput(input_layouts=(p.Shard(1),), desired_input_layouts=(p.Replicate(),)),
        "attention.wq": p.ColwiseParallel(),
        "attention.wk": p.ColwiseParallel(),
        "attention.wv": p.ColwiseParallel(),
        "attention.wo": p.RowwiseParallel(output_layouts=p.Shard(1)),
        "ffn_norm": p.SequenceParallel(),
        "feed_forward": p.PrepareModuleInput(input_layouts=(p.Shard(1),), desired_input_layouts=(p.Replicate(),)),
        "feed_forward.w1": p.ColwiseParallel(),
        "feed_forward.w2": p.RowwiseParallel(output_layouts=p.Shard(1)),
        "feed_forward.w3": p.ColwiseParallel(),
    }


class Names:
    """The plan's names from one library."""

    def __init__(self, styles, placements):
        for name in ("SequenceParallel", "PrepareModuleInput", "ColwiseParallel", "RowwiseParallel"):
            setattr(self, name, getattr(styles, name))
        self.Shard, self.Replicate = placements.Shard, placements.Replicate


# ---- the hand-written program ------------------------------------------------------------------

class GatherSequence(torch.autograd.Function):
    """[B, S/w, D] -> [B, S, D] (all_gather_into_tensor); backward: reduce_scatter_tensor."""

    @staticmethod
    def forward(ctx, x, world):
        ctx.world = world
        b, s, d = x.shape
        out = torch.empty(world * s, b, d, dtype=x.dtype)
        dist.all_gather_into_tensor(out, x.transpose(0, 1).contiguous())
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        return ScatterSequence.apply(grad, ctx.world), None


class ScatterSequence(torch.autograd.Function):
    """[B, S, D] partial sums -> [B, S/w, D] (reduce_scatter_tensor); backward: all_gather."""

    @staticmethod
    def forward(ctx, x, world):
        ctx.world = world
        b, s, d = x.shape
        out = torch.empty(s // world, b, d, dtype=x.dtype)
        dist.reduce_scatter_tensor(out, x.transpose(0, 1).contiguous())
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        return GatherSequence.apply(grad, ctx.world), None


def local_block(block, world, rank):
    """This rank's pieces of the block's weights (torch.chunk rows of the column-parallel
    weights, columns of the row-parallel ones), as plain tensors."""
    def rows(w):
        return w.detach().chunk(world, 0)[rank].clone().requires_grad_()

    def cols(w):
        return w.detach().chunk(world, 1)[rank].clone().requires_grad_()

    a, f = block.attention, block.feed_forward
    return {
        "n1": block.attention_norm.weight.detach().clone().requires_grad_(),
        "n2": block.ffn_norm.weight.detach().clone().requires_grad_(),
        "wq": rows(a.wq.weight), "wk": rows(a.wk.weight), "wv": rows(a.wv.weight), "wo": cols(a.wo.weight),
        "w1": rows(f.w1.weight), "w3": rows(f.w3.weight), "w2": cols(f.w2.weight),
    }


def hand_step(p, x, world, head_dim, numel):
    def attention(h):
        bs, seqlen, _ = h.shape
        q = F.linear(h, p["wq"]).view(bs, seqlen, -1, head_dim).transpose(1, 2)
        k = F.linear(h, p["wk"]).view(bs, seqlen, -1, head_dim).transpose(1, 2)
        v = F.linear(h, p["wv"]).view(bs, seqlen, -1, head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(out.transpose(1, 2).reshape(bs, seqlen, -1), p["wo"])

    h = x + ScatterSequence.apply(attention(GatherSequence.apply(F.rms_norm(x, x.shape[-1:], p["n1"], 1e-6), world)), world)
    g = GatherSequence.apply(F.rms_norm(h, h.shape[-1:], p["n2"], 1e-6), world)
    out = h + ScatterSequence.apply(F.linear(F.silu(F.linear(g, p["w1"])) * F.linear(g, p["w3"]), p["w2"]), world)
    loss = (out * out).sum() / numel  # this rank's part of the mean; the parts add up to it
    loss.backward()
    norms = torch.cat([p["n1"].grad, p["n2"].grad])  # partial over the sequence: one all-reduce
    dist.all_reduce(norms)
    p["n1"].grad.copy_(norms[:p["n1"].numel()])
    p["n2"].grad.copy_(norms[p["n1"].numel():])
    with torch.no_grad():
        for w in p.values():
            w.sub_(w.grad * LR)
            w.grad = None
    return loss


def library_step(model, x, opt, check_on=None):
    """As torchtitan's blocks run: the input and the output are this rank's sequence pieces,
    plain tensors (the styles' use_local_output); the loss is this rank's part of the mean.
    check_on: also return the whole loss (one all-reduce outside the timed steps)."""
    out = model(x)
    loss = (out * out).sum() / (out.numel() * dist.get_world_size())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if check_on is not None:
        whole = loss.detach().clone()
        dist.all_reduce(whole)
        return whole
    return loss


# ---- timing ------------------------------------------------------------------------------------

def step_ms(fn):
    dist.barrier()
    start = time.perf_counter()
    fn()
    t = torch.tensor([(time.perf_counter() - start) * 1e3], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def spread(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "all": values}


def check(ok, what):
    if not ok:
        raise SystemExit(f"tp_block_bench: check failed: {what}")


def counts_of(mode):
    return ", ".join(f"{v} {str(k).split('.')[-1]}" for k, v in sorted(mode.get_comm_counts().items(), key=str)) or "none"


def run_size(name, sizes, world, rank, mesh, tmesh, steps):
    from torch.distributed.tensor import Replicate as TReplicate
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode
    from torch.distributed.tensor.parallel import (ColwiseParallel as TColwise, PrepareModuleInput as TPrepareInput,
                                                   RowwiseParallel as TRowwise, SequenceParallel as TSequence,
                                                   parallelize_module as torch_parallelize)

    import shardtensor.parallel as sp

    batch, seqlen, dim, heads, hidden = sizes
    torch.manual_seed(0)
    block = Block(dim, heads, hidden)
    x_full = torch.randn(batch, seqlen, dim)
    x_local = x_full.chunk(world, 1)[rank].contiguous()
    numel = x_full.numel()

    hand = local_block(block, world, rank)

    ours = sp.parallelize_module(copy.deepcopy(block), mesh, block_plan(Names(sp, st)))
    ours_opt = torch.optim.SGD(ours.parameters(), lr=LR)

    import types
    theirs = torch_parallelize(copy.deepcopy(block), tmesh, block_plan(Names(
        types.SimpleNamespace(SequenceParallel=TSequence, PrepareModuleInput=TPrepareInput, ColwiseParallel=TColwise,
                              RowwiseParallel=TRowwise),
        types.SimpleNamespace(Shard=TShard, Replicate=TReplicate))))
    theirs_opt = torch.optim.SGD(theirs.parameters(), lr=LR)

    # One step of each from the same weights: the same loss and the same updated weights.
    hand_loss = hand_step(hand, x_local, world, dim // heads, numel).detach().clone()
    dist.all_reduce(hand_loss)
    with st.CommDebugMode() as ours_comms:
        ours_loss = library_step(ours, x_local, ours_opt, mesh)
    with TorchCommDebugMode() as theirs_comms:
        theirs_loss = library_step(theirs, x_local, theirs_opt, tmesh)
    check(torch.allclose(ours_loss, hand_loss, rtol=1e-4, atol=1e-6), f"{name}: shardtensor loss {ours_loss} vs {hand_loss}")
    check(torch.allclose(theirs_loss, hand_loss, rtol=1e-4, atol=1e-6), f"{name}: DTensor loss {theirs_loss} vs {hand_loss}")
    for key, path in (("wq", "attention.wq.weight"), ("wo", "attention.wo.weight"), ("w2", "feed_forward.w2.weight"),
                      ("n1", "attention_norm.weight")):
        for lib, model in (("shardtensor", ours), ("DTensor", theirs)):
            piece = model.get_parameter(path).detach().to_local()
            check(torch.allclose(piece, hand[key].detach(), rtol=1e-4, atol=1e-6), f"{name}: {lib} {path} after a step")

    programs = [lambda: hand_step(hand, x_local, world, dim // heads, numel),
                lambda: library_step(ours, x_local, ours_opt),
                lambda: library_step(theirs, x_local, theirs_opt)]
    samples = [[] for _ in programs]
    gc.collect()
    gc.disable()
    try:
        for i in range(steps + 3):
            for j, program in enumerate(programs):
                ms = step_ms(program)
                if i >= 3:
                    samples[j].append(ms)
    finally:
        gc.enable()
    hand_ms, ours_ms, theirs_ms = (spread(s) for s in samples)
    return dict(size=name, batch=batch, seq=seqlen, dim=dim, heads=heads, hidden=hidden, hand_written_ms=hand_ms,
                shardtensor_ms=ours_ms, dtensor_ms=theirs_ms,
                shardtensor_over_hand=ours_ms["median"] / hand_ms["median"],
                shardtensor_over_dtensor=ours_ms["median"] / theirs_ms["median"],
                collectives_shardtensor=counts_of(ours_comms), collectives_dtensor=counts_of(theirs_comms))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--json", help="rank 0 writes the figures here")
    args = p.parse_args()
    torch.set_num_threads(1)
    import os
    mesh = st.init_device_mesh("cpu", (int(os.environ.get("WORLD_SIZE", "1")),))
    world, rank = mesh.size(), mesh.get_rank()
    tmesh = mesh.to_torch()
    rows = [run_size(name, SIZES[name], world, rank, mesh, tmesh, args.steps) for name in args.sizes.split(",")]
    if rank == 0:
        print(f"TP transformer block step, {world} ranks, median ms of {args.steps} steps (slowest rank)")
        print("| size | hand-written | shardtensor | DTensor | st / hand | st / DTensor | collectives (st; DTensor) |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['size']} {r['batch']}x{r['seq']}x{r['dim']} h{r['heads']} f{r['hidden']} "
                  f"| {r['hand_written_ms']['median']:.3f} | {r['shardtensor_ms']['median']:.3f} "
                  f"| {r['dtensor_ms']['median']:.3f} | {r['shardtensor_over_hand']:.2f} "
                  f"| {r['shardtensor_over_dtensor']:.2f} | {r['collectives_shardtensor']}; {r['collectives_dtensor']} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(world=world, steps=args.steps, rows=rows, bar_hand=BAR_HAND, bar_dtensor=BAR_DTENSOR,
                               torch=torch.__version__, python=platform.python_version()), f, indent=1)


if __name__ == "__main__":
    main()
