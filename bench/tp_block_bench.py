"""A tensor-parallel transformer-block training step three ways, in turns, in one run:
the hand-written torch.distributed program, shardtensor through parallelize_module, and torch's
DTensor through its own parallelize_module with the same plan. Results: bench/RESULTS.md.

    .venv/bin/shardrun -n 2 .venv/bin/python bench/tp_block_bench.py [--json FILE] [--steps N]

The block is llama's (RMSNorm, causal attention with grouped-query heads and rotary positions,
SwiGLU feed-forward, both residuals; examples/llama_tensor_parallel.py) under torchtitan's
classic plan with sequence parallelism: the block's input and output are split
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
import importlib.util
import json
import os
import platform

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import shardtensor as st
from shardtensor import _dtensor_operands
from python_bench import time_in_turns  # the slowest rank's ms per call, a barrier before each, in turns

_dtensor_operands.uninstall()  # torch's DTensor timed as torch ships it, without shardtensor's operand check

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                       "llama_tensor_parallel.py")

SIZES = {  # batch, sequence, dim, heads, key/value heads, feed-forward width
    "small": (2, 16, 32, 4, 2, 64),
    "large": (4, 256, 256, 8, 4, 768),
}
BAR_HAND = 1.05
BAR_DTENSOR = 0.5
LR = 1e-2


def load_example():
    """examples/llama_tensor_parallel.py: the model and torchtitan's plan."""
    spec = importlib.util.spec_from_file_location("llama_tensor_parallel", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def hand_step(p, x, world, llama, shape, numel):
    head_dim, n_rep, cos, sin = shape

    def attention(h):
        bs, seqlen, _ = h.shape
        q = llama.apply_rotary(F.linear(h, p["wq"]).view(bs, seqlen, -1, head_dim), cos, sin)
        k = llama.repeat_kv(llama.apply_rotary(F.linear(h, p["wk"]).view(bs, seqlen, -1, head_dim), cos, sin), n_rep)
        v = llama.repeat_kv(F.linear(h, p["wv"]).view(bs, seqlen, -1, head_dim), n_rep)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
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


def library_step(model, x, cos, sin, opt, check_on=None):
    """As torchtitan's blocks run: the input and the output are this rank's sequence pieces,
    plain tensors (the styles' use_local_output); the loss is this rank's part of the mean.
    check_on: also return the whole loss (one all-reduce outside the timed steps)."""
    out = model(x, cos, sin)
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

def check(ok, what):
    if not ok:
        raise SystemExit(f"tp_block_bench: check failed: {what}")


def counts_of(mode):
    return ", ".join(f"{v} {str(k).split('.')[-1]}" for k, v in sorted(mode.get_comm_counts().items(), key=str)) or "none"


def run_size(name, sizes, world, rank, mesh, tmesh, steps):
    import torch.distributed.tensor as torch_tensor
    import torch.distributed.tensor.parallel as torch_parallel
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    import shardtensor.parallel as sp

    llama = load_example()
    batch, seqlen, dim, heads, kv_heads, hidden = sizes
    torch.manual_seed(0)
    block = llama.Block(dim, heads, kv_heads, hidden)
    cos, sin = llama.rotary(seqlen, dim // heads, dtype=torch.float32)
    x_full = torch.randn(batch, seqlen, dim)
    x_local = x_full.chunk(world, 1)[rank].contiguous()
    numel = x_full.numel()
    shape = (dim // heads, heads // kv_heads, cos, sin)

    hand = local_block(block, world, rank)
    ours = sp.parallelize_module(copy.deepcopy(block), mesh, llama.block_plan(sp, st))
    ours_opt = torch.optim.SGD(ours.parameters(), lr=LR)
    theirs = torch_parallel.parallelize_module(copy.deepcopy(block), tmesh, llama.block_plan(torch_parallel, torch_tensor))
    theirs_opt = torch.optim.SGD(theirs.parameters(), lr=LR)

    # One step of each from the same weights: the same loss and the same updated weights.
    hand_loss = hand_step(hand, x_local, world, llama, shape, numel).detach().clone()
    dist.all_reduce(hand_loss)
    with st.CommDebugMode() as ours_comms:
        ours_loss = library_step(ours, x_local, cos, sin, ours_opt, mesh)
    with TorchCommDebugMode() as theirs_comms:
        theirs_loss = library_step(theirs, x_local, cos, sin, theirs_opt, tmesh)
    check(torch.allclose(ours_loss, hand_loss, rtol=1e-4, atol=1e-6), f"{name}: shardtensor loss {ours_loss} vs {hand_loss}")
    check(torch.allclose(theirs_loss, hand_loss, rtol=1e-4, atol=1e-6), f"{name}: DTensor loss {theirs_loss} vs {hand_loss}")
    for key, path in (("wq", "attention.wq.weight"), ("wo", "attention.wo.weight"), ("w2", "feed_forward.w2.weight"),
                      ("n1", "attention_norm.weight")):
        for lib, model in (("shardtensor", ours), ("DTensor", theirs)):
            piece = model.get_parameter(path).detach().to_local()
            check(torch.allclose(piece, hand[key].detach(), rtol=1e-4, atol=1e-6), f"{name}: {lib} {path} after a step")

    programs = [lambda: hand_step(hand, x_local, world, llama, shape, numel),
                lambda: library_step(ours, x_local, cos, sin, ours_opt),
                lambda: library_step(theirs, x_local, cos, sin, theirs_opt)]
    hand_ms, ours_ms, theirs_ms = (stat.json() for stat in time_in_turns(programs, steps))
    return dict(size=name, batch=batch, seq=seqlen, dim=dim, heads=heads, kv_heads=kv_heads, hidden=hidden, hand_written_ms=hand_ms,
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
            print(f"| {r['size']} {r['batch']}x{r['seq']}x{r['dim']} h{r['heads']}/{r['kv_heads']} f{r['hidden']} "
                  f"| {r['hand_written_ms']['median']:.3f} | {r['shardtensor_ms']['median']:.3f} "
                  f"| {r['dtensor_ms']['median']:.3f} | {r['shardtensor_over_hand']:.2f} "
                  f"| {r['shardtensor_over_dtensor']:.2f} | {r['collectives_shardtensor']}; {r['collectives_dtensor']} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(world=world, steps=args.steps, rows=rows, bar_hand=BAR_HAND, bar_dtensor=BAR_DTENSOR,
                               torch=torch.__version__, python=platform.python_version()), f, indent=1)


if __name__ == "__main__":
    main()
