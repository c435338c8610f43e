"""Why a pack costs more than its own time before a Gloo collective on an oversubscribed host.

Times, with raw torch.distributed over Gloo (no shardtensor), the all_to_all of S(0)->S(1) on
[2048, 2048] float32 with its buffers prepared, the pack of this rank's strided parts alone,
and the two back to back, plus a busy loop as long as the pack before the same all_to_all.
On the 2-core development VM with 4 ranks the pair cost 0.7-1.7 ms more than the sum of its
parts (stop 44), whether the work before is a pack or a busy loop touching no memory: the ranks'
Gloo I/O threads wait for cores the others' copies hold (stop 44 in `git show 655ea7b:bench/RESULTS.md`).

    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456 \
        build-torch2/tools/shardrun/shardrun -n 4 .venv/bin/python bench/gloo_copy_then_collective.py

(shardrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and OMP_NUM_THREADS=1; the venv's
torch is the one `./dev.sh build` sets up for the wheel line.)

Prints, on rank 0, the median over 41 runs (slowest rank each run) of every program, twice.
"""
import time

import torch
import torch.distributed as dist

N = 2048


def median_ms(fn, runs=41):
    for _ in range(3):
        fn()
    samples = []
    for _ in range(runs):
        dist.barrier()
        start = time.perf_counter()
        fn()
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        samples.append(elapsed.item() * 1e3)
    return sorted(samples)[runs // 2]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    rows, cols = N // world, N // world
    local = torch.rand(rows, N)  # this rank's S(0) piece
    part = rows * cols  # what it sends each peer for S(1)
    splits = [0 if peer == rank else part for peer in range(world)]
    send, receive = torch.rand(part * (world - 1)), torch.empty(part * (world - 1))
    pack_seconds = 0.0

    def collective():
        dist.all_to_all_single(receive, send, splits, splits)

    def pack():
        return torch.cat([local[:, peer * cols:(peer + 1) * cols].reshape(-1) for peer in range(world) if peer != rank])

    def busy_loop():
        start = time.perf_counter()
        while time.perf_counter() - start < pack_seconds:
            pass

    programs = {
        "all_to_all alone": collective,
        "pack alone": pack,
        "pack, then all_to_all": lambda: (pack(), collective()),
        "busy loop as long as the pack, then all_to_all": lambda: (busy_loop(), collective()),
    }
    results = {name: [] for name in programs}
    for _ in range(2):
        for name, program in programs.items():
            results[name].append(median_ms(program))
            if name == "pack alone":
                pack_seconds = results[name][-1] / 1e3
    if rank == 0:
        for name, ms in results.items():
            print(f"{name}: " + ", ".join(f"{m:.3f} ms" for m in ms))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
