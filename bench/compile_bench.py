"""torch.compile against eager, in one run: a tensor-parallel MLP step with shardtensor and with
torch's DTensor, and the demo's U-Net step on an H split. Results: bench/RESULTS.md.

    .venv/bin/shardrun -n 4 .venv/bin/python bench/compile_bench.py [--json FILE] [--steps N]
    shardrun -n 1 python3 bench/compile_bench.py --device cuda   # on a GPU (tools/gpu_check/run.sh)

TP-MLP (bench/python_bench.py's section 3, sizes 32 x 256 x 1024 and 64 x 512 x 2048): W1
Shard(0), W2 Shard(1), input and target Replicate; a step is the forward and the mean-square loss
(the part handed to torch.compile, backend inductor), then backward and an SGD update (eager, as
a training loop runs them). Four variants: shardtensor eager and compiled, DTensor eager and
compiled (torch's DTensor traces to functional collectives, which Inductor sees). Beside them, the
step's local work alone in plain torch (each rank's pieces, no all-reduce), eager and compiled:
what torch.compile itself saves, or costs, on this computation at this size. U-Net: the
demo's model (examples/heat_unet_demo.py, float32, Replicate parameters) on its 250 x 190 field
split unevenly over H, forward and loss compiled, eager and compiled.

By default shardtensor's operators are traced under torch.compile (python/shardtensor/_compile.py;
SHARDTENSOR_COMPILE=eager runs them eagerly behind graph breaks instead): the compiled
TP-MLP step is one graph of local operators and shardtensor's moves (exchange_parts through peer
memory on one host, else torch's functional collectives), as DTensor's is one graph of local
operators and functional collectives; the U-Net is one graph too, halos and upsampling
included (docs/python.md#torchcompile). Variants take turns, a barrier before each step; median of --steps steps
after warm-up (the compile happens there), the slowest rank's time. Each variant's first loss is
checked against shardtensor's eager one from the same weights, and each variant's weights after
that first step (so its gradients) against eager's, before anything is timed.

--device cuda: CUDA pieces on a cuda mesh (NCCL, one GPU per rank), Inductor's Triton kernels;
each timed step ends in torch.cuda.synchronize(), and the TP-MLP adds a size large enough for the
GPU to be busy. Values are compared with a float32 tolerance of 1e-4: Inductor's fused reductions
and cuDNN's convolution algorithms sum in other orders than eager's kernels.
"""

import argparse
import copy
import json
import os
import platform
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import Replicate as DReplicate
from torch.distributed.tensor import Shard as DShard
from torch.distributed.tensor import distribute_tensor as dt_distribute

import shardtensor as st
from shardtensor import _dtensor_operands
from python_bench import Stat, check, mlp_loss, run_ms, sgd_step
from unet_dp_domain_bench import load_demo

_dtensor_operands.uninstall()  # torch's DTensor timed as torch ships it, without shardtensor's operand check

TP_SIZES = [(32, 256, 1024), (64, 512, 2048)]
CUDA_TP_SIZES = TP_SIZES + [(1024, 1024, 4096)]
LR = 1e-3


def full(t):
    """The whole tensor: a ShardTensor's or DTensor's gathered, a plain one as it is (shardtensor
    installs full_tensor on every torch.Tensor, so the method's presence does not tell)."""
    return t.full_tensor() if st.is_shard_tensor(t) or isinstance(t, DTensor) else t


class Device:
    """Where the pieces live, and what "equal" and "done" mean there."""

    def __init__(self, kind: str):
        self.kind = kind
        self.rtol, self.atol = (1e-5, 1e-7) if kind == "cpu" else (1e-4, 1e-6)

    def put(self, t):
        return t.to(self.kind)

    def close(self, a, b) -> bool:
        return torch.allclose(a, b, rtol=self.rtol, atol=self.atol)

    def timed(self, step):
        """The step as timed: on CUDA until its kernels have finished."""
        if self.kind == "cpu":
            return step
        return lambda: (step(), torch.cuda.synchronize())


def max_difference(a, b) -> float:
    return (a - b).abs().max().item()


def time_variants(steps_of: dict, steps: int, warmup: int = 3) -> dict:
    """Each variant's step in turns: {name: Stat of the slowest rank's ms}."""
    for _ in range(warmup):
        for f in steps_of.values():
            f()
    samples = {name: [] for name in steps_of}
    for _ in range(steps):
        for name, f in steps_of.items():
            samples[name].append(run_ms(f))
    return {name: Stat(s) for name, s in samples.items()}


def local_loss(x, w1, w2, target):
    """mlp_loss on this rank's plain pieces, without the row-parallel all-reduce: what torch.compile
    makes of the step's local work alone, the reference for what it can save on this machine."""
    return mlp_loss(x, w1, w2, target)


def tp_rows(mesh, tmesh, steps, device):
    rows = []
    for batch, dim, hidden in (TP_SIZES if device.kind == "cpu" else CUDA_TP_SIZES):
        torch.manual_seed(0)
        x, target = device.put(torch.randn(batch, dim)), device.put(torch.randn(batch, dim))
        w1, w2 = device.put(torch.randn(hidden, dim) * 0.02), device.put(torch.randn(dim, hidden) * 0.02)
        compiled = torch.compile(mlp_loss, backend="inductor")

        def ours():
            return (st.distribute_tensor(x, mesh, [st.Replicate()]), st.distribute_tensor(w1, mesh, [st.Shard(0)]).requires_grad_(),
                    st.distribute_tensor(w2, mesh, [st.Shard(1)]).requires_grad_(), st.distribute_tensor(target, mesh, [st.Replicate()]))

        def theirs():
            return (dt_distribute(x, tmesh, [DReplicate()]), dt_distribute(w1, tmesh, [DShard(0)]).requires_grad_(),
                    dt_distribute(w2, tmesh, [DShard(1)]).requires_grad_(), dt_distribute(target, tmesh, [DReplicate()]))

        def pieces():
            return tuple(t.to_local().detach().clone().requires_grad_(t.requires_grad) for t in ours())

        args = {"shardtensor eager": ours(), "shardtensor compiled": ours(), "DTensor eager": theirs(), "DTensor compiled": theirs(),
                "torch eager": pieces(), "torch compiled": pieces()}
        fns = {"shardtensor eager": mlp_loss, "shardtensor compiled": compiled, "DTensor eager": mlp_loss, "DTensor compiled": compiled,
               "torch eager": local_loss, "torch compiled": torch.compile(local_loss, backend="inductor")}
        steps_of = {name: (lambda f=fns[name], a=args[name]: sgd_step(*a, LR, loss_fn=f)) for name in args}
        first = {name: full(f()).detach() for name, f in steps_of.items()}
        what = f"TP-MLP {batch}x{dim}x{hidden}"
        differences = {}
        for name, loss in first.items():
            # The local work alone is checked against itself eager: it is not the model's loss.
            against = "torch eager" if name.startswith("torch") else "shardtensor eager"
            reference = [full(w).detach() for w in args[against][1:3]]
            check(device.close(loss, first[against]), f"{what}: {name}'s loss {loss} against {against}'s {first[against]}")
            weights = [full(w).detach() for w in args[name][1:3]]
            for w, ref, label in zip(weights, reference, ("w1", "w2")):
                check(device.close(w, ref), f"{what}: {name}'s {label} after one step differs from {against}'s "
                                            f"by up to {max_difference(w, ref):.3g}")
            differences[name] = max(max_difference(w, ref) for w, ref in zip(weights, reference))
        steps_of = {name: device.timed(f) for name, f in steps_of.items()}
        rows.append(dict(batch=batch, dim=dim, hidden=hidden, weight_difference=differences,
                         **{k: v.json() for k, v in time_variants(steps_of, steps).items()}))
    return rows


def unet_row(mesh, steps, device):
    demo = load_demo()
    world = mesh.size()
    fields, targets = demo.heat_dataset()
    u, target = device.put(fields[:demo.BATCH].float()), device.put(targets[:demo.BATCH].float())
    sizes = {2: demo.uneven_split(demo.HEIGHT, world)}
    su = st.distribute_tensor(u, mesh, [st.Shard(2)], sharding_shapes=sizes)
    starget = st.distribute_tensor(target, mesh, [st.Shard(2)], sharding_shapes=sizes)
    torch.manual_seed(11)
    eager_model = demo.replicate_module(demo.UNet().to(device.kind), mesh)
    compiled_model = copy.deepcopy(eager_model)
    compiled_forward = torch.compile(compiled_model, backend="inductor")

    def step(model, forward):
        loss = F.mse_loss(forward(su), starget)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(p.grad * LR)
                p.grad = None
        return loss

    steps_of = {"eager": lambda: step(eager_model, eager_model), "compiled": lambda: step(compiled_model, compiled_forward)}
    first = {name: f().full_tensor().detach() for name, f in steps_of.items()}
    check(device.close(first["compiled"], first["eager"]), f"U-Net: compiled loss {first['compiled']} against eager {first['eager']}")
    difference = 0.0
    for (name, p), q in zip(compiled_model.named_parameters(), eager_model.parameters()):
        p, q = full(p.detach()), full(q.detach())
        check(device.close(p, q), f"U-Net: compiled {name} after one step differs from eager's by up to {max_difference(p, q):.3g}")
        difference = max(difference, max_difference(p, q))
    steps_of = {name: device.timed(f) for name, f in steps_of.items()}
    return dict(height=demo.HEIGHT, width=demo.WIDTH, batch=demo.BATCH, sizes=sizes[2], weight_difference=difference,
                **{k: v.json() for k, v in time_variants(steps_of, steps).items()})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100, help="timed steps per variant (default 100: the 4-rank steps share 2 cores, and fewer left medians 10%% apart between runs)")
    p.add_argument("--json", metavar="FILE", help="rank 0 also writes the figures to FILE")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the pieces live (cuda: one GPU per rank, a cuda mesh over NCCL)")
    args = p.parse_args()
    device = Device(args.device)
    if device.kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    mesh = st.init_device_mesh(device.kind, (int(os.environ.get("WORLD_SIZE", "1")),))
    tmesh = mesh.to_torch()
    t0 = time.time()
    tp = tp_rows(mesh, tmesh, args.steps, device)
    unet = unet_row(mesh, args.steps, device)
    dist.barrier()
    if dist.get_rank() == 0:
        where = torch.cuda.get_device_name() if device.kind == "cuda" else platform.processor() or "cpu"
        mode = os.environ.get("SHARDTENSOR_COMPILE", "trace")
        print(f"torch.compile (inductor, SHARDTENSOR_COMPILE={mode}) against eager, {mesh.size()} ranks on {where}, "
              f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}; median ms of {args.steps} steps, slowest rank")
        for r in tp:
            print(f"TP-MLP {r['batch']} x {r['dim']} x {r['hidden']}: " + ", ".join(
                f"{k} {r[k]['median']:.3f}" for k in ("shardtensor eager", "shardtensor compiled", "DTensor eager", "DTensor compiled",
                                                      "torch eager", "torch compiled"))
                + "; weights after one step within " + f"{max(r['weight_difference'].values()):.2g} of eager's")
        print(f"U-Net {unet['height']} x {unet['width']}, batch {unet['batch']}, H split {unet['sizes']}: "
              f"eager {unet['eager']['median']:.1f}, compiled {unet['compiled']['median']:.1f}; "
              f"weights after one step within {unet['weight_difference']:.2g} of eager's")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"bench": "compile_bench", "torch": torch.__version__, "python": platform.python_version(),
                           "world": mesh.size(), "device": device.kind, "steps": args.steps, "tp_mlp": tp, "unet": unet,
                           "seconds": time.time() - t0}, f, indent=1)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    main()
