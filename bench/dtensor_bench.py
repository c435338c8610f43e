"""torch's own DTensor on the cases of dispatch_bench and redistribute_bench, for comparison.

Runs under shardrun with the venv's torch (./dev.sh installs it):
    build-torch2/tools/shardrun/shardrun -n 4 .venv/bin/python bench/dtensor_bench.py
Same shapes, same timing rule as the C++ programs: dispatch medians of 2000 calls of the op
from Python (plain torch op on the local tensor, then the op on the DTensor, cache warm);
redistribute medians of 61 runs, slowest rank per run (each run ends in a barrier-free max
all-reduce of its time). DTensor supports only torch.chunk layouts, so only even cases run.
"""
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor


def median_us(fn, runs):
    for _ in range(20):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def slowest_rank_median_ms(fn, runs=61):
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        elapsed = torch.tensor([(time.perf_counter() - start) * 1e3], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    return statistics.median(times)


def main():
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world,))
    if rank == 0:
        print(f"torch {torch.__version__} DTensor, world size {world}")
        print(f"{'op':22s} {'size':>6s} {'plain us':>10s} {'dtensor us':>10s} {'over us':>10s}")
    for n in (8, 64):
        torch.manual_seed(0)
        a, b = torch.randn(n * world, n), torch.randn(n, n)
        sa, sb = distribute_tensor(a, mesh, [Shard(0)]), distribute_tensor(b, mesh, [Replicate()])
        la = sa.to_local()
        ops = [
            ("add", lambda x, y: x + x),
            ("mul scalar", lambda x, y: x * 2),
            ("relu", lambda x, y: x.relu()),
            ("sum unsharded dim", lambda x, y: x.sum(1)),
            ("mm S(0) x R", lambda x, y: torch.mm(x, y)),
            ("view", lambda x, y: x.view(x.size(0), x.size(1) // 2, 2)),
            ("t", lambda x, y: x.t()),
        ]
        for name, f in ops:
            plain = median_us(lambda: f(la, b), 2000)
            wrapped = median_us(lambda: f(sa, sb), 2000)
            if rank == 0:
                print(f"{name:22s} {n:6d} {plain:10.2f} {wrapped:10.2f} {wrapped - plain:10.2f}")

    shape = (2048, 2048)
    x = torch.rand(shape)
    rows = distribute_tensor(x, mesh, [Shard(0)])
    partial = torch.distributed.tensor.DTensor.from_local(torch.rand(shape), mesh, [Partial()], run_check=False)
    cases = [
        ("S(0)->R even", lambda: rows.redistribute(mesh, [Replicate()]).to_local()),
        ("S(0)->S(1) even", lambda: rows.redistribute(mesh, [Shard(1)]).to_local()),
        ("P(sum)->R even", lambda: partial.redistribute(mesh, [Replicate()]).to_local()),
        ("P(sum)->S(0) even", lambda: partial.redistribute(mesh, [Shard(0)]).to_local()),
    ]
    if rank == 0:
        print(f"| transition ({world} ranks) | DTensor ms |")
        print("|---|---|")
    for name, f in cases:
        ms = slowest_rank_median_ms(f)
        if rank == 0:
            print(f"| {name} | {ms:.3f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
