"""A training step under sharded data parallelism, shardtensor's fully_shard against torch's FSDP2,
in turns, in one run: 1-D data parallelism over 4 ranks, and FSDP x TP on a 2x2 ("dp", "tp")
mesh (DTensor's parallelize_module under torch's FSDP2 against shardtensor's under its own).
Results: bench/RESULTS.md.

    .venv/bin/shardrun -n 4 .venv/bin/python bench/fsdp_bench.py [--json FILE] [--steps N]

The model: 4 residual feed-forward blocks (x + W2 gelu(W1 x)), each wrapped by fully_shard, and
the root; float32. Sizes: "even" (dim 256, hidden 1024: every split is even) and "uneven"
(dim 250, hidden 1002: 250 rows over 4 ranks, 501 over 2; FSDP2 pads them, shardtensor does not).
A step: forward of this rank's batch (16 rows), mean-square loss, backward, AdamW (fused, as
torchtitan's configurations step it), zero_grad. Before timing, both programs take one step from the same weights and data, and
their parameters must agree with each other. Each step's time is the slowest rank's, median of
--steps, the programs in turns with a barrier before each step.

Bytes: what shardtensor's collectives send in one step (CommDebugMode, summed over ranks)
against what FSDP2's schedule needs without padding: (dp - 1) x the bytes the ranks hold, for one
all-gather and one reduce-scatter of every parameter and the backward's second all-gather of the
blocks' (they reshard after forward; shardtensor gathers only what the backward reads, so it may
send less); FSDP2's padded dim-0 size gives its padding. Memory: the largest rank's parameter,
gradient and AdamW-state bytes against a quarter of the one-process model's (the gradients
counted as during a step), the unsharded parameter bytes held from a forward to its
backward (by default the root's only) against the largest wrapped module's, and the peak
during one step (what the step began with plus the most the CPU allocator held on top of it at
once, from torch's profiler's memory events) against issue 75's bar; and the same peak with
foreach AdamW, whose step allocates one temporary the size of all parameter pieces (the fused
kernel allocates none).

Prefetch: shardtensor again, with FSDP2's explicit prefetch (each module's forward starts the
next one's all-gathers, its backward the previous one's), in the same turns; and the share of
the prefetched gathers' time its main thread computed through (the overlap).

Compiled (FSDP x TP): the same step with the model under torch.compile (inductor), each program
against itself eager, in turns: shardtensor eager and compiled, FSDP2 eager and compiled.
shardtensor's all-gathers and reduce-scatters are traced with the tensor-parallel moves
(SimpleFSDP's form); FSDP2's hooks run eagerly between the compiled blocks (dynamo's
skip_fsdp_hooks).
Before timing, each compiled program's gradients after one step must equal its eager one's.
"""

import argparse
import copy
import json
import os
import platform

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import shardtensor as st
from shardtensor import _dtensor_operands
from shardtensor.fsdp import _prefetch
from python_bench import time_in_turns

_dtensor_operands.uninstall()  # torch's DTensor timed as torch ships it, without shardtensor's operand check

SIZES = {"even": (256, 1024), "uneven": (250, 1002)}
BLOCKS, BATCH = 4, 16


class Block(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.w2(F.gelu(self.w1(x)))


class Model(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(BLOCKS))
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def _local_bytes(t):
    """The bytes of this rank's piece: a ShardTensor's or a torch DTensor's local tensor."""
    from torch.distributed.tensor import DTensor

    local = t._local_tensor if st.is_shard_tensor(t) or isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def _state_bytes(model, optimizer):
    """This rank's parameter pieces and the optimizer's states of them: what it holds between
    steps, its gradients freed."""
    states = (v for s in optimizer.state.values() for k, v in s.items() if k != "step")
    return sum(_local_bytes(p) for p in model.parameters()) + sum(_local_bytes(v) for v in states)


def _largest_over_ranks(values):
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def whole(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def step_fn(model, x, forward=None, implementation="fused"):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **{implementation: True})
    forward = model if forward is None else forward

    def step():
        forward(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    step.optimizer = opt
    return step


def with_prefetch(model):
    """FSDP2's explicit prefetch, as torchtitan configures it: each module's forward starts the
    next one's all-gathers, its backward the previous one's."""
    order = [model, *model.blocks]
    for module, following in zip(order, order[1:]):
        module.set_modules_to_forward_prefetch([following])
    for module, preceding in zip([model, *reversed(model.blocks)], reversed(model.blocks)):
        module.set_modules_to_backward_prefetch([preceding])
    return model


def peak_allocated_during(step) -> int:
    """The most bytes the CPU allocator held at once during `step` beyond what it held when the
    step began: torch's profiler records every allocation and free of the step (profile_memory),
    summed in order. Shared-memory buffers of the peer-memory transport are not the allocator's
    and are not counted."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def build(reference, layout, mesh, tmesh):
    """(shardtensor's model, torch's model) for the layout, from the same weights."""
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel as TColwise, RowwiseParallel as TRowwise
    from torch.distributed.tensor.parallel import parallelize_module as torch_parallelize

    from shardtensor.fsdp import fully_shard
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    ours, theirs = copy.deepcopy(reference), copy.deepcopy(reference)
    if layout == "FSDP x TP":
        plan = {f"blocks.{i}.w1": ColwiseParallel() for i in range(BLOCKS)} | \
               {f"blocks.{i}.w2": RowwiseParallel() for i in range(BLOCKS)}
        tplan = {f"blocks.{i}.w1": TColwise() for i in range(BLOCKS)} | {f"blocks.{i}.w2": TRowwise() for i in range(BLOCKS)}
        parallelize_module(ours, mesh["tp"], plan)
        torch_parallelize(theirs, tmesh["tp"], tplan)
        dp_mesh, tdp_mesh = mesh["dp"], tmesh["dp"]
    else:
        dp_mesh, tdp_mesh = mesh, tmesh
    for model, shard, m in ((ours, fully_shard, dp_mesh), (theirs, torch_fully_shard, tdp_mesh)):
        for block in model.blocks:
            shard(block, mesh=m)
        shard(model, mesh=m)
    return ours, theirs


def run(layout, size, mesh, tmesh, steps):
    dim, hidden = SIZES[size]
    dp = 2 if layout == "FSDP x TP" else mesh.size()
    dp_rank = mesh.get_coordinate()[0]
    torch.manual_seed(0)
    reference = Model(dim, hidden)
    ours, theirs = build(reference, layout, mesh, tmesh)
    prefetching = with_prefetch(build(reference, layout, mesh, tmesh)[0])
    x = torch.randn(dp, BATCH, dim, generator=torch.Generator().manual_seed(1))[dp_rank]
    ours_step, theirs_step, prefetching_step = step_fn(ours, x), step_fn(theirs, x), step_fn(prefetching, x)
    with st.CommDebugMode() as comms:
        ours_step()
    theirs_step()
    prefetching_step()
    for (name, p), (_, q), (_, r) in zip(ours.named_parameters(), theirs.named_parameters(), prefetching.named_parameters()):
        torch.testing.assert_close(whole(p), whole(q), rtol=1e-3, atol=1e-4, msg=lambda m: f"{layout} {size} {name}: {m}")
        torch.testing.assert_close(whole(r), whole(p), rtol=0, atol=0, msg=lambda m: f"{layout} {size} {name}, prefetch: {m}")
    sent = torch.tensor([comms.get_bytes()], dtype=torch.float64)
    dist.all_reduce(sent)
    param_bytes = sum(p.numel() * 4 for p in reference.parameters())
    padded_bytes = sum(-(-p.shape[0] // dp) * dp * (p.numel() // p.shape[0]) * 4 for p in reference.parameters())
    tp = mesh.size() // dp
    # Each dp group all-gathers and reduce-scatters what its ranks hold (a tensor-parallel piece,
    # or a whole parameter tensor parallelism replicates), each piece to the dp - 1 others.
    # The blocks reshard after forward (FSDP2's default for all but the root), so their
    # parameters may be gathered again in backward: FSDP2 gathers all of them.
    stored = torch.tensor([sum(p._local_tensor.numel() * 4 for p in ours.parameters()),
                           sum(p._local_tensor.numel() * 4 for b in ours.blocks for p in b.parameters())],
                          dtype=torch.float64)
    dist.all_reduce(stored)
    fewest = int(stored[0].item() * 2 + stored[1].item()) * (dp - 1)
    # Between steps: the parameter pieces, their gradients (freed by zero_grad, counted as held
    # during the step) and AdamW's two states; the largest rank's.
    held = _state_bytes(ours, ours_step.optimizer) + sum(_local_bytes(p) for p in ours.parameters())
    # During a step: what is held when it begins (the parameter pieces and AdamW's states; the
    # gradients were freed by zero_grad) and the most allocated on top of it at once (gradients,
    # unsharded parameters, activations, buffers); the largest rank's.
    # FSDP2's from the same profiler, beside it; ours without the optimizer's step; and ours with
    # foreach AdamW (its own states, made by one step before the measured one).
    at_start = _state_bytes(ours, ours_step.optimizer)
    peak = at_start + peak_allocated_during(ours_step)
    theirs_peak = _state_bytes(theirs, theirs_step.optimizer) + peak_allocated_during(theirs_step)
    peak_without_optimizer = at_start + peak_allocated_during(lambda: ours(x).pow(2).mean().backward())
    ours_step.optimizer.zero_grad()
    foreach_step = step_fn(ours, x, implementation="foreach")
    foreach_step()
    peak_foreach = _state_bytes(ours, foreach_step.optimizer) + peak_allocated_during(foreach_step)
    del foreach_step
    held, peak, theirs_peak, peak_without_optimizer, peak_foreach = (
        int(v.item()) for v in _largest_over_ranks([held, peak, theirs_peak, peak_without_optimizer, peak_foreach]))
    # Between a forward and its backward: the unsharded parameter bytes still held (by default
    # only the root's: the blocks reshard after forward), against the largest wrapped module's.
    loss = ours(x).pow(2).mean()
    unsharded_held = sum(_local_bytes(u) for p in ours.parameters() if (u := p._fsdp_param.last_unsharded()) is not None)
    loss.backward()
    ours_step.optimizer.zero_grad()
    with torch.no_grad():
        largest = max(sum(_local_bytes(fp.gather(fp.sharded)) for fp in m._fsdp_state.params)
                      for m in [ours, *ours.blocks])
    stats = _prefetch.STATISTICS
    gathers, gather_s, waited_s = stats.gathers, stats.gather_s, stats.waited_s
    ours_ms, theirs_ms, prefetching_ms = time_in_turns([ours_step, theirs_step, prefetching_step], steps)
    _prefetch.STREAM.drain()
    # The share of the prefetched gathers' time the main thread computed through instead of
    # waiting for them to finish; the smallest over the ranks.
    overlap = 1 - (stats.waited_s - waited_s) / (stats.gather_s - gather_s)
    prefetch_overlap = -_largest_over_ranks([-overlap])[0].item()
    return dict(layout=layout, size=size, dim=dim, hidden=hidden, dp=dp, tp=tp, shardtensor_ms=ours_ms.json(),
                torch_ms=theirs_ms.json(), ratio=float(ours_ms) / float(theirs_ms), bytes_sent=int(sent.item()),
                prefetch_ms=prefetching_ms.json(), prefetch_gathers=(stats.gathers - gathers) // (steps + 3),
                prefetch_overlap=prefetch_overlap,
                bytes_fewest=fewest, padded_parameter_bytes=padded_bytes, parameter_bytes=param_bytes,
                held_bytes=held, peak_bytes=peak, torch_peak_bytes=theirs_peak, peak_without_optimizer=peak_without_optimizer,
                peak_foreach_bytes=peak_foreach,
                one_process_bytes=param_bytes * 4, unsharded_after_forward=unsharded_held,
                largest_module_unsharded=largest)


def compiled_run(size, mesh, tmesh, steps):
    """FSDP x TP, eager against torch.compile, for shardtensor and for torch's FSDP2."""
    dim, hidden = SIZES[size]
    torch.manual_seed(0)
    reference = Model(dim, hidden)
    ours, theirs = build(reference, "FSDP x TP", mesh, tmesh)
    ours_c, theirs_c = build(reference, "FSDP x TP", mesh, tmesh)
    x = torch.randn(2, BATCH, dim, generator=torch.Generator().manual_seed(1))[mesh.get_coordinate()[0]]
    forwards = {"shardtensor eager": (ours, ours), "shardtensor compiled": (ours_c, torch.compile(ours_c)),
                "FSDP2 eager": (theirs, theirs), "FSDP2 compiled": (theirs_c, torch.compile(theirs_c))}
    # Gradients, not parameters after an AdamW step: Adam's first step moves every weight by about
    # lr whatever its gradient's size, so a gradient near 0 summed in another order flips its sign.
    for _, forward in forwards.values():
        forward(x).pow(2).mean().backward()
    for eager, compiled, who in ((ours, ours_c, "shardtensor"), (theirs, theirs_c, "FSDP2")):
        for (name, p), (_, q) in zip(compiled.named_parameters(), eager.named_parameters()):
            g, h = whole(p.grad), whole(q.grad)
            torch.testing.assert_close(g, h, rtol=0, atol=1e-5 * h.abs().max().item(),
                                       msg=lambda m: f"compiled {who} {size}: gradient of {name} against eager's: {m}")
            p.grad = q.grad = None
    steps_of = {name: step_fn(model, x, forward) for name, (model, forward) in forwards.items()}
    ms = dict(zip(steps_of, time_in_turns(list(steps_of.values()), steps)))
    return dict(size=size, dim=dim, hidden=hidden, **{k: v.json() for k, v in ms.items()})


def peak_bar(row) -> float:
    """Issue 75's bar on the peak during a step: a quarter of the one-process model's parameter,
    gradient and AdamW bytes + 5 % (the bar between steps), plus the largest wrapped module
    unsharded, + 10 %."""
    return 1.10 * (1.05 * row["one_process_bytes"] / 4 + row["largest_module_unsharded"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", help="rank 0 writes the figures here")
    args = p.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != 4:
        raise SystemExit("fsdp_bench.py: run it on 4 ranks (shardrun -n 4)")
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh

    rows = []
    for layout, shape, names in (("FSDP", (4,), ("dp",)), ("FSDP x TP", (2, 2), ("dp", "tp"))):
        mesh = st.init_device_mesh("cpu", shape, mesh_dim_names=names)
        tmesh = torch_mesh("cpu", shape, mesh_dim_names=names)
        for size in SIZES:
            rows.append(run(layout, size, mesh, tmesh, args.steps))
    compiled = [compiled_run(size, mesh, tmesh, args.steps) for size in SIZES]  # the last mesh: FSDP x TP
    if dist.get_rank() == 0:
        print(f"FSDP step, 4 ranks, ms of the slowest rank, min / median / max of {args.steps} steps")
        print("| layout | size | shardtensor ms | torch FSDP2 ms | shardtensor / FSDP2 | bytes sent (all ranks) | "
              "fewest | FSDP2's padded parameter bytes / parameter bytes | held per rank / one process's | "
              "unsharded bytes after forward / largest module's | peak during a step | forward and backward alone | "
              "FSDP2's peak | bar | peak with foreach AdamW | shardtensor with prefetch ms | prefetched gathers per step | overlap |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            a, b, c = r["shardtensor_ms"], r["torch_ms"], r["prefetch_ms"]
            print(f"| {r['layout']} (dp {r['dp']}, tp {r['tp']}) | {r['size']}: dim {r['dim']}, hidden {r['hidden']} "
                  f"| {a['min']:.1f} / {a['median']:.1f} / {a['max']:.1f} | {b['min']:.1f} / {b['median']:.1f} / {b['max']:.1f} "
                  f"| {r['ratio']:.2f} | {r['bytes_sent']:,} | {r['bytes_fewest']:,} "
                  f"| {r['padded_parameter_bytes'] / r['parameter_bytes']:.4f} | {r['held_bytes'] / r['one_process_bytes']:.4f} "
                  f"| {r['unsharded_after_forward']:,} / {r['largest_module_unsharded']:,} | {r['peak_bytes']:,} "
                  f"| {r['peak_without_optimizer']:,} | {r['torch_peak_bytes']:,} | {peak_bar(r):,.0f} | {r['peak_foreach_bytes']:,} "
                  f"| {c['min']:.1f} / {c['median']:.1f} / {c['max']:.1f} | {r['prefetch_gathers']} | {r['prefetch_overlap']:.2f} |")
        print(f"\nFSDP x TP (dp 2, tp 2) under torch.compile (inductor), ms of the slowest rank, median of {args.steps} steps")
        print("| size | shardtensor eager | shardtensor compiled | compiled / eager | FSDP2 eager | FSDP2 compiled | compiled / eager |")
        print("|---|---|---|---|---|---|---|")
        for r in compiled:
            m = {k: r[k]["median"] for k in ("shardtensor eager", "shardtensor compiled", "FSDP2 eager", "FSDP2 compiled")}
            print(f"| {r['size']}: dim {r['dim']}, hidden {r['hidden']} | {m['shardtensor eager']:.1f} | {m['shardtensor compiled']:.1f} "
                  f"| {m['shardtensor compiled'] / m['shardtensor eager']:.2f} | {m['FSDP2 eager']:.1f} | {m['FSDP2 compiled']:.1f} "
                  f"| {m['FSDP2 compiled'] / m['FSDP2 eager']:.2f} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(rows=rows, compiled=compiled, steps=args.steps, torch=torch.__version__, python=platform.python_version()),
                          f, indent=1)


if __name__ == "__main__":
    main()
