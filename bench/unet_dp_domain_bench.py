"""The demo's U-Net training step under PhysicsNeMo's recipe, on every (dp, domain) split of the
ranks in one run: plain weights, torch's DDP over "dp", the field split over H on "domain";
ms per step, and the bytes each rank sends per step next to the fewest the layout needs.
Results: bench/RESULTS.md.

    .venv/bin/shardrun -n 4 .venv/bin/python bench/unet_dp_domain_bench.py [--json FILE] [--steps N]

The model, the data and the uneven split are examples/heat_unet_demo.py's (a 250 x 190 field,
batch 2 per dp group, float32). Bytes are payloads as CommDebugMode counts them: a halo counts
the rows sent, an all-reduce the tensor it reduces. shardtensor's are counted by CommDebugMode
(halos, the norms' statistics, the loss's mean, the plain weights' gradient sums over "domain");
DDP's by a comm hook on its buckets, plus the buffers it broadcasts before each forward. Where both
axes have more than one rank, the layout runs a second time under shardtensor.parallel's
sum_gradients_with_ddp: one sum over all ranks in DDP's buckets instead of two.

The fewest, for the busiest rank (two neighbours along H), with n_params gradients: each 3x3
convolution sends one row of its input to each neighbour, once (the backward reuses the rows the
forward received); enc1's input needs no gradient, so no adjoint; enc2's and dec's send their
gradient rows back in backward. Group norm needs two sums
per (sample, group) forward and two backward, batch norm two per channel each way, the loss one;
and the gradient is summed over all ranks once: n_params values. Pooling and upsampling move
nothing (the split's sizes are even). Before timing, each layout's first loss is checked against
one process's on the same batches.
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
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import shardtensor as st
from python_bench import time_in_turns  # the slowest rank's ms per call, a barrier before each, in turns

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "heat_unet_demo.py")
ELEMENT = 4  # float32


def load_demo():
    spec = importlib.util.spec_from_file_location("heat_unet_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fewest_bytes(demo, domain: int, n_params: int, world: int) -> dict:
    """What the busiest rank must send per step (see the module's docstring)."""
    batch, width = demo.BATCH, demo.WIDTH
    neighbours = min(domain - 1, 2)
    halo = neighbours * (1 * width + 2 * 8 * (width // 2) + 2 * 24 * width) * batch
    statistics = (2 * 2 * batch * 2 + 2 * 2 * 16 + 1) if domain > 1 else 0
    gradients = n_params if world > 1 else 0
    return dict(halo=halo * ELEMENT, statistics=statistics * ELEMENT, gradients=gradients * ELEMENT)


class Layout:
    """One (dp, domain) split: the model under DDP on "dp", its inputs split over "domain"."""

    def __init__(self, demo, dp, domain, fields, targets, one_sum=False):
        self.dp, self.domain_size, self.one_sum = dp, domain, one_sum
        self.mesh = st.init_device_mesh("cpu", (dp, domain), mesh_dim_names=("dp", "domain"))
        self.domain = self.mesh["domain"]
        group = self.mesh.get_coordinate()[0]
        torch.manual_seed(11)
        self.single = demo.UNet()
        model = copy.deepcopy(self.single)
        self.ddp_bytes = 0
        self.model = nn.parallel.DistributedDataParallel(model, process_group=self.mesh["dp"].get_group())
        dp_group = self.mesh["dp"].get_group()

        def counting_hook(_, bucket):
            self.ddp_bytes += bucket.buffer().numel() * bucket.buffer().element_size() if dp > 1 else 0
            return default_hooks.allreduce_hook(dp_group, bucket)

        if one_sum:  # DDP sums over every rank once; shardtensor hands it each rank's term
            self.mesh_sum = st.parallel.sum_gradients_with_ddp(self.model, self.mesh)
        else:
            self.model.register_comm_hook(None, counting_hook)
        self.buffer_bytes = sum(b.nbytes for b in model.buffers()) if dp > 1 else 0  # broadcast before each forward
        self.opt = torch.optim.Adam(self.model.parameters(), lr=3e-3)
        self.n_params = sum(p.numel() for p in model.parameters())
        first = (group * demo.BATCH) % demo.FIELDS
        self.batches = [(fields[(g * demo.BATCH) % demo.FIELDS:][:demo.BATCH], targets[(g * demo.BATCH) % demo.FIELDS:][:demo.BATCH])
                        for g in range(dp)]
        sizes = {2: demo.uneven_split(demo.HEIGHT, domain)}
        u, target = fields[first:first + demo.BATCH], targets[first:first + demo.BATCH]
        self.u = st.distribute_tensor(u, self.domain, [st.Shard(2)], sharding_shapes=sizes)
        self.target = st.distribute_tensor(target, self.domain, [st.Shard(2)], sharding_shapes=sizes)

    def step(self):
        self.opt.zero_grad()
        loss = F.mse_loss(self.model(self.u), self.target)
        loss.backward()
        self.opt.step()
        return loss

    def check_first_loss(self):
        """The first step's loss, averaged over dp, against one process on the same batches."""
        with torch.no_grad():
            expected = sum(F.mse_loss(self.single(u), t) for u, t in self.batches).item() / self.dp
        loss = self.step().full_tensor().detach().reshape(1)
        dist.all_reduce(loss, group=self.mesh["dp"].get_group())
        got = loss.item() / self.dp
        if abs(got - expected) > 1e-5 * abs(expected):
            raise SystemExit(f"dp={self.dp} x domain={self.domain_size}: first loss {got} differs from one process's "
                             f"{expected}; not timing a wrong program")

    def bytes_of_one_step(self):
        """(shardtensor's bytes, DDP's bytes) this rank sends in one step."""
        self.ddp_bytes = 0
        before = self.mesh_sum.bytes if self.one_sum else 0
        with st.CommDebugMode() as comms:
            self.step()
        if self.one_sum:
            self.ddp_bytes = self.mesh_sum.bytes - before
        return comms.get_bytes(), self.ddp_bytes + self.buffer_bytes


def busiest(value: int) -> int:
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", help="rank 0 writes the figures here")
    args = p.parse_args()
    torch.set_num_threads(1)
    demo = load_demo()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    splits = [(dp, world // dp) for dp in range(1, world + 1) if world % dp == 0]
    fields, targets = demo.heat_dataset()
    layouts = [Layout(demo, dp, domain, fields, targets) for dp, domain in splits]
    layouts += [Layout(demo, dp, domain, fields, targets, one_sum=True) for dp, domain in splits if dp > 1 and domain > 1]
    for layout in layouts:
        layout.check_first_loss()
    measured = [layout.bytes_of_one_step() for layout in layouts]
    times = time_in_turns([layout.step for layout in layouts], args.steps)
    rows = []
    for layout, (ours, ddp), ms in zip(layouts, measured, times):
        fewest = fewest_bytes(demo, layout.domain_size, layout.n_params, world)
        ours_total = busiest(ours + ddp)
        rows.append(dict(dp=layout.dp, domain=layout.domain_size, one_sum=layout.one_sum, ms=ms.json(), shardtensor_bytes=busiest(ours),
                         ddp_bytes=busiest(ddp), bytes=ours_total, fewest=fewest, fewest_bytes=sum(fewest.values()),
                         over_fewest=ours_total / max(sum(fewest.values()), 1), n_params=layout.n_params))
    if dist.get_rank() == 0:
        print(f"U-Net step, DDP over dp x H split over domain, {world} ranks, median ms of {args.steps} steps (slowest rank)")
        print("| dp x domain | ms/step | bytes sent (shardtensor + DDP) | fewest (halo + statistics + gradients) | ratio |")
        print("|---|---|---|---|---|")
        for r in rows:
            f = r["fewest"]
            how = " (sum_gradients_with_ddp)" if r["one_sum"] else ""
            print(f"| {r['dp']} x {r['domain']}{how} | {r['ms']['median']:.1f} | {r['shardtensor_bytes']} + {r['ddp_bytes']} "
                  f"| {f['halo']} + {f['statistics']} + {f['gradients']} | {r['over_fewest']:.2f} |")
        if args.json:
            with open(args.json, "w") as out:
                json.dump(dict(world=world, steps=args.steps, rows=rows, height=demo.HEIGHT, width=demo.WIDTH,
                               batch=demo.BATCH, torch=torch.__version__, python=platform.python_version()), out, indent=1)


if __name__ == "__main__":
    main()
