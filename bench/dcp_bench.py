"""torch.distributed.checkpoint's save of a sharded model: ShardTensors against torch's DTensors,
in turns, in one run. Results: bench/RESULTS.md.

    .venv/bin/shardrun -n 4 .venv/bin/python bench/dcp_bench.py [--gib 1.0] [--rounds 3] [--dir DIR]

The model: square float32 weights, `--gib` GiB in all, Shard(0) over the 4 ranks (each rank
holds a quarter), the same values as ShardTensors and as DTensors; each round saves both with
dcp.save (torch's FileSystemWriter, its default planner) into a fresh folder under --dir, then
deletes it. Seconds of the slowest rank, min / median / max over the rounds; before timing, the
ShardTensor checkpoint is loaded into the DTensor model and must equal it (the two write the
same chunks).
"""

import argparse
import os
import platform
import shutil
import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import Shard as DShard
from torch.distributed.tensor import distribute_tensor as dt_distribute

import shardtensor as st
from shardtensor import _dtensor_operands

_dtensor_operands.uninstall()  # torch's DTensor timed as torch ships it, without shardtensor's operand check


def timed_save(state, path):
    dist.barrier()
    start = time.perf_counter()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
    took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        shutil.rmtree(path)
    dist.barrier()
    return took.item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default="out/dcp_bench")
    args = p.parse_args()
    mesh = st.init_device_mesh("cpu", (int(os.environ.get("WORLD_SIZE", "1")),))
    tmesh = mesh.to_torch()
    side, count = 8192, max(1, round(args.gib * 2**30 / (8192 * 8192 * 4)))
    ours, theirs = {}, {}
    for i in range(count):
        torch.manual_seed(i)
        whole = torch.randn(side, side)
        ours[f"w{i}"] = st.distribute_tensor(whole, mesh, [st.Shard(0)], src_data_rank=None)
        theirs[f"w{i}"] = dt_distribute(whole, tmesh, [DShard(0)], src_data_rank=None)
        del whole
    check = f"{args.dir}/check"
    dcp.save({"model": ours}, storage_writer=dcp.FileSystemWriter(check))
    loaded = {"model": {k: torch.zeros_like(v) for k, v in theirs.items()}}
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(check))
    for k, v in theirs.items():
        assert torch.equal(loaded["model"][k].to_local(), v.to_local()), k
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(check)
    ours_s, theirs_s = [], []
    for r in range(args.rounds):
        ours_s.append(timed_save({"model": ours}, f"{args.dir}/ours-{r}"))
        theirs_s.append(timed_save({"model": theirs}, f"{args.dir}/theirs-{r}"))
    if dist.get_rank() == 0:
        gib = count * side * side * 4 / 2**30
        fmt = lambda s: f"{min(s):.2f} / {statistics.median(s):.2f} / {max(s):.2f}"
        print(f"dcp.save of {gib:.2f} GiB, {dist.get_world_size()} ranks, {args.rounds} rounds, torch "
              f"{torch.__version__}, Python {platform.python_version()}")
        print("| tensors | shardtensor s | DTensor s | DTensor / shardtensor (throughput ratio) |")
        print("|---|---|---|---|")
        print(f"| {count} x [{side}, {side}] float32, Shard(0) | {fmt(ours_s)} | {fmt(theirs_s)} "
              f"| {statistics.median(theirs_s) / statistics.median(ours_s):.2f} |")


if __name__ == "__main__":
    main()
