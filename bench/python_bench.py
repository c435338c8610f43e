"""shardtensor from Python, next to torch's own DTensor and plain torch / raw torch.distributed,
in one run at one world size (run it at 2 and at 4 ranks). Results: bench/RESULTS.md.

    .venv/bin/shardrun -n 2 .venv/bin/python bench/python_bench.py
    .venv/bin/shardrun -n 4 .venv/bin/python bench/python_bench.py
    (build-torch2/tools/shardrun/shardrun works the same, where it has been built)

Three sections, each a Markdown table printed by rank 0 (--sections 1,2,3 picks some):

1. Per-op overhead from Python, propagation cache warm, layouts that need no communication
   (checked: zero collectives for both libraries): the plain torch op on this rank's local
   piece, the same op on a shardtensor ShardTensor and on a torch DTensor with the same
   layout, at 8x8 and 64x64 local pieces (global [8 * world, 8] and [64 * world, 64], Shard(0);
   weights and bias Replicate). Each figure is the median over 51 rounds of the mean of a
   timeit loop of 1000 calls (warm-up first; the three variants take turns in every round,
   so the machine's slow spells hit them alike), on rank 0 while the other ranks wait. "over" = figure - plain. Also: the Python
   functions entered per op beyond the plain op (sys.setprofile; 0 = shardtensor dispatches
   in C++ only), and the C++ overhead of the same op from build-torch2/bench/dispatch_bench,
   which rank 0 runs under shardrun at the same world size while the other ranks wait.
   --device cuda times it on CUDA pieces (a cuda mesh over NCCL: one GPU per rank; the host
   cost of launching each op, the GPU queue drained between timeit loops).
2. redistribute from Python on 16 MiB float32 tensors ([2048, 2048] even, [2047, 2049]
   uneven: torch.chunk splits it unevenly at 2 and 4 ranks; shardtensor gets those sizes as
   explicit sharding_shapes, DTensor its torch.chunk layout), next to the raw torch.distributed
   collective on buffers prepared outside the timed region, whose output is the whole result
   (all_to_all_single with split sizes, all_reduce; --raw-allgather: all_gather_into_tensor for
   S(0)->R even). Median of 61 runs after 3 warm-ups, a barrier before every run, the slowest
   rank's time per run; shardtensor and the raw collective take turns, then DTensor and the raw
   collective (see pairs()).
   The C++ reference, build-torch2/bench/redistribute_bench --only 'S(0)->' (the same shapes,
   the same timing rule), runs before and after the Python timings, and the Python / C++
   ratio is taken against the mean of the two. Like redistribute_bench, this process keeps
   freed memory (mallopt at start): otherwise each fresh 16 MiB result page-faults again.
3. A tensor-parallel MLP step as bench/tp_mlp_bench.cpp (W1 split by output rows =
   column-parallel, W2 by input columns = row-parallel, forward, MSE loss, backward, SGD
   update): hand-written (local F.linear + one dist.all_reduce of the output, gradient sent
   back by hand), shardtensor, and DTensor with the same placements (manual, as with
   shardtensor: Shard(0) W1, Shard(1) W2, Replicate input and target). The three steps take
   turns, a barrier before each; median of 60 steps after 5 warm-ups, slowest rank per step.
   Sizes: tp_mlp_bench's two and a larger one where compute dominates.

Every case is checked once before it is timed: the shardtensor result (and the DTensor one)
must equal the plain / raw / hand-written result, so no wrong code gets timed.

--json FILE: rank 0 also writes every figure (min / median / max over the rounds, runs or steps)
to FILE as one JSON object, for bench/regenerate.py.
"""
import argparse
import ctypes
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import timeit
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardtensor as st
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import Partial as DPartial
from torch.distributed.tensor import Replicate as DReplicate
from torch.distributed.tensor import Shard as DShard
from torch.distributed.tensor import distribute_tensor as dt_distribute
from torch.distributed.tensor.debug import CommDebugMode as DTCommDebugMode

try:  # torch's DTensor timed as torch ships it, without shardtensor's operand check
    from shardtensor import _dtensor_operands

    _dtensor_operands.uninstall()
except ImportError:  # an earlier package (bench/before_after.sh) installs no such check
    pass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bars (the brief): per-op overhead at 8x8, redistribute and TP-MLP ratios.
BAR_OVER_US = 1.5
BAR_DT_RATIO = 10.0
BAR_PY_CXX = 1.1
BAR_TP = 1.05


def keep_freed_memory():
    """glibc's mallopt as redistribute_bench does: M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 256 MiB."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(-3, 32 << 20) == 1 and libc.mallopt(-1, 256 << 20) == 1
    except OSError:
        ok = False
    return ok


class Stat(float):
    """A median that also carries the min and max of its samples (arithmetic gives plain floats)."""

    def __new__(cls, samples):
        self = super().__new__(cls, statistics.median(samples))
        self.min, self.max = min(samples), max(samples)
        return self

    def json(self):
        return {"min": self.min, "median": float(self), "max": self.max}


class Ctx:
    def __init__(self, args):
        self.args = args
        # init_device_mesh initialises torch.distributed (Gloo, or NCCL for cuda) from the
        # launcher's environment.
        self.device = args.device
        self.mesh = st.init_device_mesh(args.device, (int(os.environ.get("WORLD_SIZE", "1")),))
        self.tmesh = self.mesh.to_torch()
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.notes = []
        self.results = {}  # section -> rows, for --json

    def log(self, *a):
        if self.rank == 0:
            print(*a, flush=True)

    def note(self, text):
        self.notes.append(text)


def check(cond, what):
    if not cond:
        raise AssertionError(f"[rank {dist.get_rank()}] validation failed: {what}")


def chunk_sizes(n, parts):
    return [len(c) for c in torch.arange(n).chunk(parts)] + [0] * (parts - len(torch.arange(n).chunk(parts)))


# ---------------------------------------------------------------------------------------------
# 1. per-op overhead
# ---------------------------------------------------------------------------------------------

OPS = [
    # name, statement, input layout -> output layout (both libraries, checked)
    ("add", "x + x", "S(0) + S(0) -> S(0)"),
    ("mul scalar", "x * 2", "S(0) -> S(0)"),
    ("relu", "x.relu()", "S(0) -> S(0)"),
    ("sum(1)", "x.sum(1)", "S(0) -> S(0)"),
    ("sum()", "x.sum()", "S(0) -> P(sum)"),
    ("mm", "mm(x, w)", "S(0) x R -> S(0)"),
    ("view", "x.view(shape)", "S(0) -> S(0)"),
    ("t", "x.t()", "S(0) -> S(1)"),
    ("linear", "linear(x, w, bias)", "S(0), R, R -> S(0)"),
]


def python_calls_per_op(code, env, reps=50):
    """Python function frames entered per execution of `code` (sys.setprofile 'call' events)."""
    count = [0]

    def prof(frame, event, arg):
        if event == "call":
            count[0] += 1

    exec(code, env)
    sys.setprofile(prof)
    try:
        for _ in range(reps):
            exec(code, env)
    finally:
        sys.setprofile(None)
    return count[0] / reps


def section_ops(ctx: Ctx):
    args = ctx.args
    number, rounds = args.op_number, args.op_rounds
    w = ctx.world
    rows = []
    for n in (8, 64):
        torch.manual_seed(0)
        a, wt, bias = (t.to(ctx.device) for t in (torch.randn(n * w, n), torch.randn(n, n), torch.randn(n)))
        sa = st.distribute_tensor(a, ctx.mesh, [st.Shard(0)])
        sw = st.distribute_tensor(wt, ctx.mesh, [st.Replicate()])
        sbias = st.distribute_tensor(bias, ctx.mesh, [st.Replicate()])
        da = dt_distribute(a, ctx.tmesh, [DShard(0)])
        dw = dt_distribute(wt, ctx.tmesh, [DReplicate()])
        dbias = dt_distribute(bias, ctx.tmesh, [DReplicate()])
        la = sa.to_local()
        check(torch.equal(la, da.to_local()), "local pieces of both libraries")
        envs = {
            "plain": dict(x=la, w=wt, bias=bias, shape=(la.shape[0], n // 2, 2), mm=torch.mm, linear=F.linear),
            "st": dict(x=sa, w=sw, bias=sbias, shape=(a.shape[0], n // 2, 2), mm=torch.mm, linear=F.linear),
            "dt": dict(x=da, w=dw, bias=dbias, shape=(a.shape[0], n // 2, 2), mm=torch.mm, linear=F.linear),
        }
        for name, stmt, layout in OPS:
            code = compile(stmt, name, "eval")
            # Validate: same local values as the plain op, the expected placements, no collective.
            expected = eval(code, envs["plain"])
            with st.CommDebugMode() as cm:
                got = eval(code, envs["st"])
            with DTCommDebugMode() as dcm:
                dgot = eval(code, envs["dt"])
            check(st.is_shard_tensor(got), f"{name}: shardtensor result is sharded")
            check(torch.allclose(got.to_local(), expected, rtol=1e-6, atol=1e-6), f"{name} {n}: shardtensor values")
            check(torch.allclose(dgot.to_local(), expected, rtol=1e-6, atol=1e-6), f"{name} {n}: DTensor values")
            want = layout.split("-> ")[1]
            pl = st_placement_str(got.placements)
            check(pl == want, f"{name}: shardtensor placements {pl}, expected {want}")
            check(st_placement_str(dgot.placements) == want, f"{name}: DTensor placements {dgot.placements}")
            check(cm.get_total_counts() == 0, f"{name}: shardtensor communicated {cm.get_comm_counts()}")
            check(dcm.get_total_counts() == 0, f"{name}: DTensor communicated {dcm.get_comm_counts()}")
            del got, dgot
            # Timed on rank 0 only, the other ranks waiting in a barrier (asleep in Gloo): the ops
            # are local, and 4 ranks timing at once on 2 cores would time the scheduler.
            dist.barrier()
            if ctx.rank == 0:
                timers = {k: timeit.Timer(stmt, globals=envs[k]) for k in ("plain", "st", "dt")}
                for t in timers.values():  # warm-up
                    t.timeit(number)
                samples = {k: [] for k in timers}
                for _ in range(rounds):
                    for k, t in timers.items():
                        samples[k].append(t.timeit(number) / number * 1e6)
                        if ctx.device == "cuda":
                            torch.cuda.synchronize()  # outside the timed loop: each loop starts on an empty queue
                med = {k: Stat(v) for k, v in samples.items()}
                # Python frames entered per op beyond the plain op's (the exec'd statement itself is one).
                base = python_calls_per_op(code, envs["plain"])
                calls = {k: python_calls_per_op(code, envs[k]) - base for k in ("st", "dt")}
                rows.append((name, layout, n, med["plain"], med["st"], med["dt"], calls["st"], calls["dt"]))
            dist.barrier()
    dist.barrier()  # every rank validated (a failed check raises and shardrun stops all ranks)
    cxx = run_cxx_dispatch(ctx) if ctx.args.cxx_dispatch != "none" else {}
    if st.fallback_operators():
        ctx.note(f"fallback operators after section 1: {st.fallback_operators()}")

    ctx.log(f"\n### 1. Per-op overhead from Python ({w} ranks; median µs per op; local piece n x n, "
            f"global [n * {w}, n]; cache warm, no communication)\n")
    ctx.log("| op | layout | n | plain µs | shardtensor µs | DTensor µs | shardtensor over µs | DTensor over µs "
            "| DTensor over / shardtensor over | Python calls per op (st / DTensor) | C++ shardtensor over µs |")
    ctx.log("|---|---|---|---|---|---|---|---|---|---|---|")
    misses = []
    for name, layout, n, plain, s, d, cst, cdt in rows:
        so, do = s - plain, d - plain
        ratio = f"{do / so:.1f}x" if so > 0.05 else f"> {do / 0.05:.0f}x (st over ≈ 0)"
        c = cxx.get((name, n))
        ctx.log(f"| {name} | {layout} | {n} | {plain:.2f} | {s:.2f} | {d:.2f} | {so:.2f} | {do:.2f} | {ratio} "
                f"| {cst:.0f} / {cdt:.0f} | {'n/a' if c is None else f'{c:.2f}'} |")
        ctx.results.setdefault("ops", []).append(dict(
            op=name, layout=layout, n=n, plain_us=plain.json(), shardtensor_us=s.json(), dtensor_us=d.json(),
            python_calls_shardtensor=cst, python_calls_dtensor=cdt, cxx_over_us=c))
        if n == 8 and so > BAR_OVER_US:
            misses.append(f"{name}: shardtensor {so:.2f} µs over plain at 8x8 (bar {BAR_OVER_US})")
        if do < BAR_DT_RATIO * so:
            misses.append(f"{name} {n}x{n}: DTensor over / shardtensor over = {do / so:.1f}x (bar {BAR_DT_RATIO:.0f}x)")
    if ctx.rank != 0:
        return rows
    eight = [r for r in rows if r[2] == 8]
    worst = max(r[4] - r[3] for r in eight)
    ctx.log(f"\nBar shardtensor ≤ {BAR_OVER_US} µs above plain at 8x8: {'met' if worst <= BAR_OVER_US else 'NOT met'} "
            f"(worst {worst:.2f} µs).")
    ctx.log(f"Bar DTensor overhead ≥ {BAR_DT_RATIO:.0f}x shardtensor's: "
            f"{'met on every row' if not any('DTensor over' in m for m in misses) else 'NOT met on some rows'}.")
    for m in misses:
        ctx.log(f"- missed: {m}")
    return rows


def st_placement_str(placements):
    out = []
    for p in placements:
        s = repr(p)
        m = re.match(r"Shard\(dim=(-?\d+)\)", s) or re.match(r"Shard\((-?\d+)\)", s)
        if m:
            out.append(f"S({m.group(1)})")
        elif s.startswith("Replicate"):
            out.append("R")
        elif s.startswith("Partial"):
            out.append("P(sum)")
        else:
            out.append(s)
    return ",".join(out)


# ---------------------------------------------------------------------------------------------
# 2. redistribute
# ---------------------------------------------------------------------------------------------

def mlp_loss(x, w1, w2, target):
    """The TP-MLP's forward and loss, the same code for either library. The mean squared error is
    written out: torch 2.15's DTensor has no sharding strategy for aten.mse_loss on the
    row-parallel layer's pending sum, and raises."""
    return (F.linear(F.relu(F.linear(x, w1)), w2) - target).square().mean()


def sgd_step(x, w1, w2, target, lr, loss_fn=mlp_loss):
    """One TP-MLP training step: `loss_fn` (mlp_loss, or a compiled one), backward, SGD update."""
    loss = loss_fn(x, w1, w2, target)
    loss.backward()
    with torch.no_grad():
        for p in (w1, w2):
            p.sub_(p.grad * lr)
            p.grad.zero_()
    return loss


def run_ms(fn):
    dist.barrier()
    start = time.perf_counter()
    fn()
    t = torch.tensor([(time.perf_counter() - start) * 1e3], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_in_turns(fns, runs, warmup=3):
    for _ in range(warmup):
        for f in fns:
            f()
    samples = [[] for _ in fns]
    gc.collect()
    gc.disable()
    try:
        for _ in range(runs):
            for i, f in enumerate(fns):
                samples[i].append(run_ms(f))
    finally:
        gc.enable()
    return [Stat(s) for s in samples]


def pairs(ours, theirs, raw, runs):
    """shardtensor and the raw collective in turns, then DTensor and the raw collective in turns.

    Not all three in one rotation: what runs in between matters (a DTensor redistribute walks
    through 16-50 MiB of fresh memory and leaves the caches and the heap cold for the next run;
    shardtensor's S(0)->S(1) at 2 ranks took 1.3 ms alone, 1.6-2.6 ms with DTensor in its rotation), and
    redistribute_bench, the C++ reference, rotates shardtensor with raw collectives only.
    Returns (shardtensor ms, DTensor ms, raw ms next to shardtensor, raw ms next to DTensor)."""
    ours_ms, raw1 = time_in_turns([ours, raw], runs)
    theirs_ms, raw2 = time_in_turns([theirs, raw], runs)
    return ours_ms, theirs_ms, raw1, raw2


def section_redistribute(ctx: Ctx):
    w, me = ctx.world, ctx.rank
    mesh, tmesh = ctx.mesh, ctx.tmesh
    runs = ctx.args.redist_runs
    rows = []
    # The C++ reference runs before and after the Python timings; the mean of the two is used.
    cxx_runs = [run_cxx_redistribute(ctx)] if ctx.args.cxx != "none" else []
    for shape in ((2048, 2048), (2047, 2049)):
        tag = "even" if shape[0] % w == 0 and shape[1] % w == 0 else "uneven"
        torch.manual_seed(1)
        g = torch.rand(shape)
        rows0, cols1 = chunk_sizes(shape[0], w), chunk_sizes(shape[1], w)
        r_off = [sum(rows0[:i]) for i in range(w)]
        c_off = [sum(cols1[:i]) for i in range(w)]
        mine = g[r_off[me]:r_off[me] + rows0[me]].contiguous()
        # shardtensor: explicit sizes (the torch.chunk ones, so that DTensor can hold the same layout)
        sizes0, sizes1 = {0: rows0}, {1: cols1}
        sx = st.from_local(mine.clone(), mesh, [st.Shard(0)], sharding_shapes=sizes0)
        check(sx.shard_sizes() == sizes0, "shardtensor source layout")
        dx = dt_distribute(g, tmesh, [DShard(0)])
        check(torch.equal(dx.to_local(), mine), "DTensor source piece")

        # --- S(0) -> R
        # Raw: all_to_all_single sending this rank's rows to every rank (even and uneven alike; the
        # output is the whole tensor). On Gloo it is faster than all_gather_into_tensor (4 ranks:
        # ~11 vs ~18 ms), and it is the kind of collective redistribute_bench rotates with.
        # --raw-allgather times all_gather_into_tensor instead for the even case.
        full_out = torch.empty(shape)
        if tag == "even" and ctx.args.raw_allgather:
            raw_name = "all_gather_into_tensor"
            raw = lambda: dist.all_gather_into_tensor(full_out, mine)  # noqa: E731
        else:
            raw_name = "all_to_all_single (splits)"
            send = torch.cat([mine.reshape(-1)] * w)
            in_splits = [mine.numel()] * w
            out_splits = [rows0[i] * shape[1] for i in range(w)]
            flat_out = full_out.view(-1)
            raw = lambda: dist.all_to_all_single(flat_out, send, out_splits, in_splits)  # noqa: E731
        raw()
        got = sx.redistribute(mesh, [st.Replicate()])
        dgot = dx.redistribute(tmesh, [DReplicate()])
        check(torch.equal(full_out, g), f"raw S(0)->R {tag}")
        check(torch.equal(got.to_local(), g), f"shardtensor S(0)->R {tag}")
        check(torch.equal(dgot.to_local(), g), f"DTensor S(0)->R {tag}")
        del got, dgot
        rows.append((f"S(0)->R {tag}", raw_name, *pairs(lambda: sx.redistribute(mesh, [st.Replicate()]),
                                                          lambda: dx.redistribute(tmesh, [DReplicate()]).to_local(),
                                                          raw, runs)))

        # --- S(0) -> S(1)
        want = g[:, c_off[me]:c_off[me] + cols1[me]].contiguous()
        send = torch.cat([mine[:, c_off[j]:c_off[j] + cols1[j]].reshape(-1) for j in range(w)])  # packed in advance
        in_splits = [rows0[me] * cols1[j] for j in range(w)]
        out_splits = [rows0[i] * cols1[me] for i in range(w)]
        slab = torch.empty(shape[0], cols1[me])  # row blocks of every source, in order: the result itself
        flat_slab = slab.view(-1)
        raw = lambda: dist.all_to_all_single(flat_slab, send, out_splits, in_splits)  # noqa: E731
        raw()
        got = sx.redistribute(mesh, [st.Shard(1)], sharding_shapes=sizes1)
        dgot = dx.redistribute(tmesh, [DShard(1)])
        check(torch.equal(slab, want), f"raw S(0)->S(1) {tag}")
        check(got.shard_sizes() == sizes1 and torch.equal(got.to_local(), want), f"shardtensor S(0)->S(1) {tag}")
        check(torch.equal(dgot.to_local(), want), f"DTensor S(0)->S(1) {tag}")
        del got, dgot
        rows.append((f"S(0)->S(1) {tag}", "all_to_all_single (splits, packed in advance)",
                     *pairs(lambda: sx.redistribute(mesh, [st.Shard(1)], sharding_shapes=sizes1),
                            lambda: dx.redistribute(tmesh, [DShard(1)]).to_local(), raw, runs)))

        # --- P(sum) -> R
        torch.manual_seed(2 + me)
        term = torch.rand(shape)
        sp = st.from_local(term, mesh, [st.Partial()])
        dp = DTensor.from_local(term, tmesh, [DPartial()], run_check=False)
        total = term.clone()
        dist.all_reduce(total)
        got = sp.redistribute(mesh, [st.Replicate()])
        dgot = dp.redistribute(tmesh, [DReplicate()])
        check(torch.allclose(got.to_local(), total, rtol=1e-6, atol=1e-6), f"shardtensor P->R {tag}")
        check(torch.allclose(dgot.to_local(), total, rtol=1e-6, atol=1e-6), f"DTensor P->R {tag}")
        check(torch.allclose(got.to_local(), dgot.to_local(), rtol=1e-6, atol=1e-6), "P->R st vs DTensor")
        del got, dgot
        dense = torch.zeros(shape)  # in place, run after run: zeros stay finite
        rows.append((f"P(sum)->R {tag}", "all_reduce", *pairs(lambda: sp.redistribute(mesh, [st.Replicate()]),
                                                              lambda: dp.redistribute(tmesh, [DReplicate()]).to_local(),
                                                              lambda: dist.all_reduce(dense), runs)))
        del sx, dx, sp, dp
    dist.barrier()  # every rank validated (a failed check raises and shardrun stops all ranks)

    if cxx_runs:
        cxx_runs.append(run_cxx_redistribute(ctx))
    wrapper_us = redistribute_wrapper_us(ctx)

    ctx.log(f"\n### 2. redistribute from Python ({w} ranks; 16 MiB float32; median ms of {runs} runs, slowest rank)\n")
    ctx.log("| transition | shardtensor ms | DTensor ms | raw torch.distributed | raw ms (next to st / DTensor) "
            "| shardtensor / raw | DTensor / raw | DTensor / shardtensor | C++ shardtensor ms (2 runs) | Python / C++ |")
    ctx.log("|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for name, raw_name, s, d, r1, r2 in rows:
        cs = [c[name] for c in cxx_runs if name in c]
        if cs:
            mean = sum(cs) / len(cs)
            ratios.append(s / mean)
            cstr = f"{' / '.join(f'{c:.3f}' for c in cs)} | {s / mean:.2f}"
        else:
            cstr = "n/a | n/a"
        ctx.log(f"| {name} | {s:.3f} | {d:.3f} | {raw_name} | {r1:.3f} / {r2:.3f} | {s / r1:.2f} | {d / r2:.2f} "
                f"| {d / s:.1f}x | {cstr} |")
        ctx.results.setdefault("redistribute", []).append(dict(
            transition=name, raw_name=raw_name, shardtensor_ms=s.json(), dtensor_ms=d.json(),
            raw_next_to_shardtensor_ms=r1.json(), raw_next_to_dtensor_ms=r2.json(), cxx_shardtensor_ms=cs))
    ctx.log(f"\nPython-side cost of the x.redistribute() wrapper (placements encoded, mesh looked up), "
            f"over calling the extension directly: {wrapper_us:.1f} µs per call.")
    if ratios:
        worst = max(ratios)
        ctx.log(f"Bar Python redistribute ≤ {BAR_PY_CXX}x C++ (mean of the C++ runs before and after): "
                f"{'met' if worst <= BAR_PY_CXX else 'NOT met'} (worst {worst:.2f}x).")
    return rows


def redistribute_wrapper_us(ctx: Ctx):
    """x.redistribute(mesh, [R], sharding_shapes=...) minus the extension call it makes, on a tiny
    Replicate tensor (no data moves); rank 0 times, the others wait."""
    from shardtensor import _C, _placements
    from shardtensor._tensor import _encode_sizes

    x = st.distribute_tensor(torch.ones(4, 4), ctx.mesh, [st.Replicate()])
    encoded = _placements.encode([st.Replicate()], 1)
    sizes = _encode_sizes(None, [st.Replicate()], ctx.mesh)
    env = dict(x=x, mesh=ctx.mesh, R=[st.Replicate()], C=_C, cpp=ctx.mesh._cpp, enc=encoded, sizes=sizes)
    us = 0.0
    dist.barrier()
    if ctx.rank == 0:
        a = timeit.Timer("x.redistribute(mesh, R)", globals=env)
        b = timeit.Timer("C.redistribute(x, cpp, enc, sizes)", globals=env)
        sa, sb = [], []
        for _ in range(31):
            sa.append(a.timeit(1000) / 1000 * 1e6)
            sb.append(b.timeit(1000) / 1000 * 1e6)
        us = statistics.median(sa) - statistics.median(sb)
    dist.barrier()
    return us


def run_cxx(ctx: Ctx, binary: str, *args) -> str:
    """Rank 0 runs a C++ bench program under shardrun at this world size while the other ranks
    wait in a barrier (blocked in Gloo, not spinning); returns its output on rank 0."""
    text = ""
    if ctx.rank == 0:
        binary = binary if os.path.isabs(binary) else os.path.join(REPO, binary)
        launcher = os.path.join(os.path.dirname(st.__file__), "bin", "shardrun")
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                            "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")}
        if not os.path.exists(binary):
            ctx.note(f"C++ bench {binary} not found: no C++ column")
        else:
            try:
                proc = subprocess.run([launcher, "-n", str(ctx.world), binary, *args], env=env,
                                      capture_output=True, text=True, timeout=ctx.args.cxx_timeout)
                text = proc.stdout
                if proc.returncode != 0:
                    ctx.note(f"{os.path.basename(binary)} exited {proc.returncode}: {proc.stderr[-500:]}")
            except subprocess.TimeoutExpired:
                ctx.note(f"{os.path.basename(binary)} timed out")
        if ctx.args.show_cxx and text:
            print(f"{os.path.basename(binary)} output:\n{text}", flush=True)
    dist.barrier()
    return text


def run_cxx_redistribute(ctx: Ctx):
    """shardtensor ms per transition from redistribute_bench (only the rows this script also has)."""
    out = {}
    for line in run_cxx(ctx, ctx.args.cxx, "--only", "S(0)->").splitlines():
        m = re.search(r"\|\s*(S\(0\)->R|S\(0\)->S\(1\)|P\(sum\)->R) (even|uneven)\s*\|\s*([0-9.]+)\s*\|", line)
        if m:
            out[f"{m.group(1)} {m.group(2)}"] = float(m.group(3))
    return out


def run_cxx_dispatch(ctx: Ctx):
    """{(op, n): overhead µs above plain ATen} from dispatch_bench (cache hit column)."""
    names = {"add": "add", "mul scalar": "mul scalar", "relu": "relu", "sum unsharded dim": "sum(1)",
             "mm S(0) x R": "mm", "view": "view", "t": "t"}
    out = {}
    for line in run_cxx(ctx, ctx.args.cxx_dispatch).splitlines():
        m = re.search(r"\]\s+(.+?)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+(-?[0-9.]+)\s+([0-9.]+)\s*$", line)
        if m and m.group(1) in names:
            out[(names[m.group(1)], int(m.group(2)))] = float(m.group(5))
    return out


# ---------------------------------------------------------------------------------------------
# 3. tensor-parallel MLP step
# ---------------------------------------------------------------------------------------------

def section_tp(ctx: Ctx):
    w, me = ctx.world, ctx.rank
    mesh, tmesh = ctx.mesh, ctx.tmesh
    lr = 1e-3
    rows = []
    for batch, dim, hidden in ctx.args.tp_sizes:
        torch.manual_seed(0)
        x, target = torch.randn(batch, dim), torch.randn(batch, dim)
        w1, w2 = torch.randn(hidden, dim) * 0.02, torch.randn(dim, hidden) * 0.02
        hs = chunk_sizes(hidden, w)
        off = sum(hs[:me])

        # By hand: this rank's rows of W1 and columns of W2, one all_reduce of the output.
        l1 = w1[off:off + hs[me]].clone().requires_grad_()
        l2 = w2[:, off:off + hs[me]].clone().requires_grad_()
        hand_loss = []

        def by_hand():
            partial = F.linear(F.relu(F.linear(x, l1)), l2)
            y = partial.detach().clone()
            dist.all_reduce(y)
            y.requires_grad_()
            loss = F.mse_loss(y, target)
            loss.backward()
            partial.backward(y.grad)
            with torch.no_grad():
                for p in (l1, l2):
                    p.sub_(p.grad * lr)
                    p.grad.zero_()
            return loss

        s1 = st.distribute_tensor(w1, mesh, [st.Shard(0)]).requires_grad_()
        s2 = st.distribute_tensor(w2, mesh, [st.Shard(1)]).requires_grad_()
        sx = st.distribute_tensor(x, mesh, [st.Replicate()])
        st_t = st.distribute_tensor(target, mesh, [st.Replicate()])

        def sharded():
            return sgd_step(sx, s1, s2, st_t, lr)

        d1 = dt_distribute(w1, tmesh, [DShard(0)]).requires_grad_()
        d2 = dt_distribute(w2, tmesh, [DShard(1)]).requires_grad_()
        dx = dt_distribute(x, tmesh, [DReplicate()])
        dtarget = dt_distribute(target, tmesh, [DReplicate()])

        def with_dtensor():
            return sgd_step(dx, d1, d2, dtarget, lr)

        # Validate one step of each from the same weights: same loss, same updated pieces.
        lh = by_hand()
        with st.CommDebugMode() as cm:
            ls = sharded()
        with DTCommDebugMode() as dcm:
            ld = with_dtensor()
        ls_full = ls.full_tensor() if st.is_shard_tensor(ls) else ls
        ld_full = ld.full_tensor()
        check(torch.allclose(ls_full.detach(), lh.detach(), rtol=1e-5, atol=1e-7), f"TP loss shardtensor {ls_full} vs {lh}")
        check(torch.allclose(ld_full.detach(), lh.detach(), rtol=1e-5, atol=1e-7), f"TP loss DTensor {ld_full} vs {lh}")
        for name, a, b in (("W1", s1, l1), ("W2", s2, l2)):
            check(torch.allclose(a.detach().to_local(), b.detach(), rtol=1e-5, atol=1e-7), f"TP {name} shardtensor")
        for name, a, b in (("W1", d1, l1), ("W2", d2, l2)):
            check(torch.allclose(a.detach().to_local(), b.detach(), rtol=1e-5, atol=1e-7), f"TP {name} DTensor")
        st_comms = cm.get_comm_counts()
        dt_comms = {str(k).split(".")[-1]: v for k, v in dcm.get_comm_counts().items()}

        fns = [by_hand, sharded, with_dtensor]
        samples = [[] for _ in fns]
        gc.collect()
        gc.disable()
        try:
            for i in range(ctx.args.tp_steps + 5):
                for j, f in enumerate(fns):
                    ms = run_ms(f)
                    if i >= 5:
                        samples[j].append(ms)
        finally:
            gc.enable()
        hand, shard, dtm = (Stat(s) for s in samples)
        rows.append((batch, dim, hidden, hand, shard, dtm, st_comms, dt_comms))
    dist.barrier()  # every rank validated (a failed check raises and shardrun stops all ranks)
    ctx.log(f"\n### 3. TP-MLP step from Python ({w} ranks; forward + MSE + backward + SGD; median ms of "
            f"{ctx.args.tp_steps} steps, slowest rank)\n")
    ctx.log("| batch x dim x hidden | hand-written ms | shardtensor ms | DTensor ms | shardtensor / hand | DTensor / hand "
            "| collectives per step (st; DTensor) |")
    ctx.log("|---|---|---|---|---|---|---|")
    for b, d, h, hand, shard, dtm, sc, dc in rows:
        ctx.log(f"| {b} x {d} x {h} | {hand:.3f} | {shard:.3f} | {dtm:.3f} | {shard / hand:.2f}x | {dtm / hand:.2f}x "
                f"| {fmt_counts(sc)}; {fmt_counts(dc)} |")
        ctx.results.setdefault("tp_mlp", []).append(dict(
            batch=b, dim=d, hidden=h, hand_written_ms=hand.json(), shardtensor_ms=shard.json(), dtensor_ms=dtm.json(),
            collectives_shardtensor=fmt_counts(sc), collectives_dtensor=fmt_counts(dc)))
    worst = max(r[4] / r[3] for r in rows)
    ctx.log(f"\nBar shardtensor ≤ {BAR_TP}x hand-written: {'met' if worst <= BAR_TP else 'NOT met'} (worst {worst:.2f}x).")
    return rows


def fmt_counts(c):
    return ", ".join(f"{v} {k}" for k, v in sorted(c.items())) or "none"


# ---------------------------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sections", default="1,2,3", help="which sections to run, e.g. 1,3")
    p.add_argument("--op-number", type=int, default=1000, help="calls per timeit loop (section 1)")
    p.add_argument("--op-rounds", type=int, default=51, help="timeit loops per variant (section 1)")
    p.add_argument("--redist-runs", type=int, default=61, help="timed runs per transition (section 2)")
    p.add_argument("--tp-steps", type=int, default=60, help="timed steps per variant (section 3)")
    p.add_argument("--tp-sizes", default="32x256x1024,64x512x2048,128x1024x4096",
                   help="batch x dim x hidden, comma separated (section 3)")
    p.add_argument("--cxx", default="build-torch2/bench/redistribute_bench",
                   help="C++ redistribute_bench to compare with (section 2), or 'none'")
    p.add_argument("--cxx-dispatch", default="build-torch2/bench/dispatch_bench",
                   help="C++ dispatch_bench to compare with (section 1), or 'none'")
    p.add_argument("--raw-allgather", action="store_true",
                   help="section 2: raw S(0)->R even is all_gather_into_tensor (default all_to_all_single)")
    p.add_argument("--cxx-timeout", type=int, default=240)
    p.add_argument("--show-cxx", action="store_true", help="print the C++ program's table too")
    p.add_argument("--json", metavar="FILE", help="rank 0 also writes every figure (min / median / max) to FILE")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the pieces live (cuda: section 1 only, one GPU per rank)")
    a = p.parse_args()
    a.sections = {int(s) for s in a.sections.split(",") if s}
    if a.device == "cuda" and a.sections != {1}:
        p.error("--device cuda times section 1 only: pass --sections 1")
    a.tp_sizes = [tuple(int(v) for v in s.split("x")) for s in a.tp_sizes.split(",") if s]
    return a


def main():
    args = parse_args()
    kept = keep_freed_memory()
    warnings.simplefilter("default")
    ctx = Ctx(args)
    ctx.log(f"shardtensor {st.__version__} on torch {torch.__version__}, Python {platform.python_version()}, "
            f"{ctx.world} ranks over {dist.get_backend()}, {os.cpu_count()} cores, "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, torch threads {torch.get_num_threads()}, "
            f"freed memory kept: {kept}, pieces on {args.device}"
            f"{' (' + torch.cuda.get_device_name() + ')' if args.device == 'cuda' else ''}, {time.strftime('%Y-%m-%d %H:%M')}")
    t0 = time.time()
    if 1 in args.sections:
        section_ops(ctx)
    if 2 in args.sections:
        section_redistribute(ctx)
    if 3 in args.sections:
        section_tp(ctx)
    fb = st.fallback_operators()
    if fb:
        ctx.note(f"operators that fell back (no sharding rule): {fb}")
    for n in ctx.notes:
        ctx.log(f"note: {n}")
    ctx.log(f"\n(total {time.time() - t0:.0f} s)")
    if args.json and ctx.rank == 0:
        settings = {k: getattr(args, k) for k in ("op_number", "op_rounds", "redist_runs", "tp_steps", "device")}
        with open(args.json, "w") as f:
            json.dump({"bench": "python_bench", "shardtensor": st.__version__, "torch": torch.__version__,
                       "python": platform.python_version(), "world": ctx.world, "backend": dist.get_backend(),
                       "freed_memory_kept": kept, "settings": settings, "sections": ctx.results,
                       "notes": ctx.notes, "seconds": time.time() - t0}, f, indent=1)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
