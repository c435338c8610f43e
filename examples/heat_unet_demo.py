"""The main demo, in Python: a small torch.nn U-Net learns one explicit step of the 2-D heat
equation on a field of an awkward size (250 x 190), split over space across the ranks with
uneven shards, and trains to the same losses as the same model on one process.

Usage (from the repository root):

    shardrun -n 4 .venv/bin/python examples/heat_unet_demo.py                  H split over 4 ranks, unevenly
    shardrun -n 4 .venv/bin/python examples/heat_unet_demo.py --mesh 2x2       H and W split over a 2 x 2 mesh
    .venv/bin/torchrun --nproc-per-node 4 examples/heat_unet_demo.py --mesh 2x2
    shardrun -n 4 .venv/bin/python examples/heat_unet_demo.py --dp 2           DDP over 2 x H split over 2
    shardrun -n 4 .venv/bin/python examples/heat_unet_demo.py --dp 2 --fsdp    the same with torch's FSDP2
    shardrun -n 4 .venv/bin/python examples/heat_unet_demo.py --compile        under torch.compile
    .venv/bin/python examples/heat_unet_demo.py                                one process (a mesh of 1)

    options: --steps N (20)  --out DIR (demo_output/python)  --mesh N | AxB (default: all ranks on one dim)
             --dp N: data parallel over a "dp" mesh axis of N times domain parallel over "domain"
             --fsdp: with --dp, torch's FSDP2 (fully_shard) instead of DDP
             --compile: torch.compile the sharded model (its operators and moves traced into graphs)

(`shardrun` is .venv/bin/shardrun, or build-torch2/tools/shardrun/shardrun.)

Every layer is ordinary torch.nn (Conv2d, GroupNorm, MaxPool2d, BatchNorm2d, Upsample(nearest),
torch.cat for the skip connection, mse_loss, torch.optim.Adam) in double precision; the sharded
run differs from the single-process one only in its inputs, parameters and buffers being
ShardTensors (inputs split over H, or H and W, with explicitly uneven shard sizes; parameters
Replicate). With --dp N it follows PhysicsNeMo's recipe instead: the weights stay plain tensors
(a plain weight next to ShardTensors counts as Replicate, and its gradient is reduced once per
backward over "domain"), each "dp" group trains on its own batch, and torch's DDP (or FSDP2 with
--fsdp) averages over "dp"; the one-process model then steps on the mean of the groups' losses.
Rank 0 trains an identical copy of the model (same initial weights) on one process
beside it and prints, per step, both losses, their relative difference, the sharded step's time
and its collectives (CommDebugMode). At the end rank 0 writes four figures to --out:

    target_field.png      the target (one heat step of the input field)
    predicted_field.png   the sharded model's prediction, shard boundaries drawn
    error_field.png       prediction - target
    loss_curves.png       loss per step, sharded and one process (log scale)

Exit status: non-zero (on every rank) when the relative loss difference of some step exceeds
1e-4, or the final prediction gathered with full_tensor() differs from the single-process one
by more than 1e-4 (relative).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardtensor as st

HEIGHT, WIDTH, BATCH, FIELDS = 250, 190, 2, 4
TOLERANCE = 1e-4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument("--out", default="demo_output/python", help="folder for the figures (default demo_output/python)")
    p.add_argument("--mesh", default=None, help="mesh shape: N or AxB (default: every rank on one mesh dim)")
    p.add_argument("--dp", type=int, default=None,
                   help="data parallel over N groups (torch's DDP) times domain parallel (H split) in each")
    p.add_argument("--fsdp", action="store_true", help="with --dp: torch's FSDP2 (fully_shard) instead of DDP")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the sharded model (operators on ShardTensors traced; SHARDTENSOR_COMPILE=eager "
                        "runs them eagerly between compiled graphs instead)")
    args = p.parse_args(argv)
    if args.dp is not None and args.mesh is not None:
        p.error("--dp and --mesh are exclusive: --dp N makes an N x (ranks / N) (dp, domain) mesh")
    if args.fsdp and args.dp is None:
        p.error("--fsdp needs --dp N")
    if args.dp is not None and args.dp < 1:
        p.error("--dp must be at least 1")
    if args.mesh is not None:
        try:
            args.mesh = tuple(int(part) for part in args.mesh.lower().split("x"))
        except ValueError:
            p.error(f"--mesh {args.mesh!r}: expected N or AxB, e.g. 4 or 2x2")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def uneven_split(total: int, pieces: int) -> list[int]:
    """Uneven on purpose: alternately 15% more and less than an even share (as the C++ demo).

    Sizes are even, so that the 2x2 pooling windows do not straddle shards and the upsampled
    decoder features land with the same boundaries as the skip connection (any split is correct;
    an odd one costs a halo exchange in the pooling and a realignment before the cat).
    """
    sizes = []
    for i in range(pieces - 1):
        share = total / pieces * (0.85 if i % 2 else 1.15) / 2
        sizes.append(2 * math.floor(share + 0.5))  # std::lround: halves away from zero
    sizes.append(total - sum(sizes))
    return sizes


def heat_dataset():
    """Smooth random fields (Gaussian blobs) and one explicit heat-equation step of each,
    u + 0.2 * laplacian(u), zero outside the field. The same seed on every rank."""
    torch.manual_seed(7)
    y = torch.arange(HEIGHT, dtype=torch.float64).view(HEIGHT, 1)
    x = torch.arange(WIDTH, dtype=torch.float64).view(1, WIDTH)
    fields = torch.zeros(FIELDS, 1, HEIGHT, WIDTH)
    for f in range(FIELDS):
        for _ in range(6):
            cy = torch.rand(()).item() * HEIGHT
            cx = torch.rand(()).item() * WIDTH
            width = 8 + torch.rand(()).item() * 25
            amplitude = torch.randn(()).item()
            fields[f, 0] += amplitude * torch.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * width * width))
    laplacian = torch.tensor([0.0, 1.0, 0.0, 1.0, -4.0, 1.0, 0.0, 1.0, 0.0]).view(1, 1, 3, 3)
    return fields, fields + 0.2 * F.conv2d(fields, laplacian, padding=1)


class UNet(nn.Module):
    """One level: conv, group norm, pool, conv, batch norm, upsample, skip (cat), conv, 1x1 head."""

    def __init__(self):
        super().__init__()
        self.enc1 = nn.Conv2d(1, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.pool = nn.MaxPool2d(2)
        self.enc2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec = nn.Conv2d(24, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 1, 1)
        self.act = nn.GELU()

    def forward(self, u):
        e1 = self.act(self.gn(self.enc1(u)))
        e2 = self.act(self.bn(self.enc2(self.pool(e1))))
        d = self.act(self.dec(torch.cat([self.up(e2), e1], dim=1)))
        return u + self.head(d)  # learns the increment


def replicate_module(module: nn.Module, mesh) -> nn.Module:
    """Every parameter and buffer becomes a Replicate ShardTensor (in place)."""
    replicate = [st.Replicate()] * mesh.ndim
    for m in module.modules():
        for name, p in list(m.named_parameters(recurse=False)):
            setattr(m, name, nn.Parameter(st.distribute_tensor(p.detach(), mesh, replicate)))
        for name, b in list(m.named_buffers(recurse=False)):
            if b is not None:
                m.register_buffer(name, st.distribute_tensor(b, mesh, replicate))
    return module


def shard_offsets(sizes: list[int]) -> list[int]:
    """Where each shard after the first begins."""
    offsets, at = [], 0
    for s in sizes[:-1]:
        at += s
        offsets.append(at)
    return offsets


def write_figures(out_dir, target, prediction, shard_sizes, sharded_losses, single_losses, mesh_text):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    os.makedirs(out_dir, exist_ok=True)
    target, prediction = target.numpy(), prediction.numpy()
    extent = (-0.5, WIDTH - 0.5, HEIGHT - 0.5, -0.5)
    lo, hi = min(target.min(), prediction.min()), max(target.max(), prediction.max())
    paths = []

    def save(fig, name, what):
        path = os.path.abspath(os.path.join(out_dir, name))
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append((path, what))

    def field_axes(title):
        fig, ax = plt.subplots(figsize=(6.0, 7.0))
        ax.set_title(title)
        ax.set_xlabel("x (W index, 0..189)")
        ax.set_ylabel("y (H index, 0..249)")
        return fig, ax

    fig, ax = field_axes("Target: one explicit heat step  u + 0.2 \u0394u")
    im = ax.imshow(target, cmap="viridis", vmin=lo, vmax=hi, extent=extent)
    fig.colorbar(im, ax=ax, label="u")
    save(fig, "target_field.png", "the target field")

    fig, ax = field_axes(f"Sharded prediction ({mesh_text})")
    im = ax.imshow(prediction, cmap="viridis", vmin=lo, vmax=hi, extent=extent)
    fig.colorbar(im, ax=ax, label="u")
    for dim, sizes in shard_sizes.items():
        label = f"shard boundary ({'H' if dim == 2 else 'W'} split {sizes})"
        for i, at in enumerate(shard_offsets(sizes)):
            kw = dict(color="white", linewidth=1.5, linestyle="--", label=label if i == 0 else None)
            if dim == 2:
                ax.axhline(at - 0.5, **kw)
            else:
                ax.axvline(at - 0.5, **kw)
    if any(len(s) > 1 for s in shard_sizes.values()):
        ax.legend(loc="upper right", fontsize="small", facecolor="0.3", labelcolor="white", framealpha=0.8)
    save(fig, "predicted_field.png", "the prediction, shard boundaries dashed white")

    error = prediction - target
    bound = max(abs(error.min()), abs(error.max()), 1e-12)
    fig, ax = field_axes("Error: prediction - target")
    im = ax.imshow(error, cmap="RdBu_r", vmin=-bound, vmax=bound, extent=extent)
    fig.colorbar(im, ax=ax, label="prediction - target")
    save(fig, "error_field.png", "prediction - target")

    fig, ax = plt.subplots(figsize=(7.0, 4.5))
    steps = range(len(sharded_losses))
    ax.plot(steps, sharded_losses, "-", color="tab:blue", linewidth=2.5, label=f"sharded ({mesh_text})")
    ax.plot(steps, single_losses, "--", color="tab:orange", linewidth=1.5, label="one process")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("MSE loss")
    ax.set_title("Training loss: sharded vs one process")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save(fig, "loss_curves.png", "loss per step, sharded and one process")
    return paths


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_default_dtype(torch.float64)
    # Ranks share the machine's cores (shardrun and torchrun set OMP_NUM_THREADS=1 themselves).
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.dp is not None:
        if world % args.dp:
            print(f"--dp {args.dp} does not divide the {world} ranks", file=sys.stderr)
            return 2
        return main_data_parallel(args, world)
    mesh_shape = args.mesh or (world,)
    mesh = st.init_device_mesh("cpu", mesh_shape)
    root = mesh.get_rank() == 0

    # Layout: H over the first mesh dim, W over the second when there is one; uneven sizes.
    layout, sizes = [], {}
    for m in range(mesh.ndim):
        if m < 2:
            layout.append(st.Shard(2 + m))
            sizes[2 + m] = uneven_split(HEIGHT if m == 0 else WIDTH, mesh.size(m))
        else:
            layout.append(st.Replicate())
    mesh_text = "mesh " + "x".join(map(str, mesh.shape)) + (", compiled" if args.compile else "")

    fields, targets = heat_dataset()
    torch.manual_seed(11)
    single_model = UNet()
    sharded_model = replicate_module(copy.deepcopy(single_model), mesh)  # the same initial weights
    single_opt = torch.optim.Adam(single_model.parameters(), lr=3e-3)
    sharded_opt = torch.optim.Adam(sharded_model.parameters(), lr=3e-3)
    if args.compile:
        sharded_model.compile()  # in place: torch.compile(module) would warn about CommDebugMode's global hooks

    # distribute_tensor is a collective (rank 0's data is the source): every rank makes this one.
    example = st.distribute_tensor(fields[:BATCH], mesh, layout, sharding_shapes=sizes)
    if root:
        print(f"U-Net on a {HEIGHT} x {WIDTH} heat field, batch {BATCH}, {mesh_text} "
              f"({world} rank{'s' if world > 1 else ''}), torch {torch.__version__}")
        print(st.layout_table(example))
        print(" step   sharded loss    single loss   rel. diff   ms/step  collectives")
    log = LossLog()
    for step in range(args.steps):
        first = (step * BATCH) % FIELDS
        u, target = fields[first:first + BATCH], targets[first:first + BATCH]
        if root:
            single_opt.zero_grad()
            single_prediction = single_model(u)
            loss = F.mse_loss(single_prediction, target)
            loss.backward()
            single_opt.step()
            single_loss = loss.item()
            single_prediction = single_prediction.detach()

        prediction, loss, ms, comms = sharded_step(sharded_model, sharded_opt, u, target, mesh, layout, sizes)
        sharded_loss = loss.full_tensor().item()
        if root:
            log.add(step, sharded_loss, single_loss, ms, comms)

    return report(args, root, prediction, single_prediction if root else None, log, targets, mesh_text)


def main_data_parallel(args, world) -> int:
    """PhysicsNeMo's recipe: plain weights, activations split over "domain", torch's DDP (or
    FSDP2) over "dp"; each dp group trains on its own batch."""
    from torch.distributed.fsdp import fully_shard

    dp = args.dp
    mesh = st.init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "domain"))
    domain = mesh["domain"]
    root = mesh.get_rank() == 0
    group = mesh.get_coordinate()[0]
    sizes = {2: uneven_split(HEIGHT, domain.size())}
    layout = [st.Shard(2)]
    wrapper = "FSDP2" if args.fsdp else "DDP"
    mesh_text = f"{wrapper} over dp={dp} x H split over domain={domain.size()}" + (", compiled" if args.compile else "")

    fields, targets = heat_dataset()
    torch.manual_seed(11)
    single_model = UNet()
    model = copy.deepcopy(single_model)  # plain weights, the same initial values
    st.sync_module_over_mesh(model, domain)  # what PhysicsNeMo's recipe does; a no-op here
    if args.fsdp:
        fully_shard(model, mesh=mesh["dp"])  # shardtensor's mesh is a torch DeviceMesh too
        sharded_model = model
    else:
        sharded_model = nn.parallel.DistributedDataParallel(model, process_group=mesh["dp"].get_group())
    single_opt = torch.optim.Adam(single_model.parameters(), lr=3e-3)
    sharded_opt = torch.optim.Adam(sharded_model.parameters(), lr=3e-3)
    if args.compile:
        sharded_model.compile()  # in place: torch.compile(module) would warn about CommDebugMode's global hooks

    def batch(step, g):
        first = ((step * dp + g) * BATCH) % FIELDS
        return fields[first:first + BATCH], targets[first:first + BATCH]

    if root:
        print(f"U-Net on a {HEIGHT} x {WIDTH} heat field, batch {BATCH} per dp group, {mesh_text} "
              f"({world} ranks), plain weights, torch {torch.__version__}")
        print(" step   sharded loss    single loss   rel. diff   ms/step  collectives")
    log, single_prediction = LossLog(), None
    for step in range(args.steps):
        if root:  # one process: the mean of the dp groups' losses, as DDP averages their gradients
            single_opt.zero_grad()
            predictions = [single_model(batch(step, g)[0]) for g in range(dp)]
            loss = sum(F.mse_loss(pred, batch(step, g)[1]) for g, pred in enumerate(predictions)) / dp
            loss.backward()
            single_opt.step()
            single_loss = loss.item()
            single_prediction = predictions[0].detach()  # dp group 0's, which rank 0 holds
        u, target = batch(step, group)
        prediction, loss, ms, comms = sharded_step(sharded_model, sharded_opt, u, target, domain, layout, sizes)
        group_loss = loss.full_tensor().detach().reshape(1)
        dist.all_reduce(group_loss, group=mesh["dp"].get_group())  # the groups' mean, for the table
        sharded_loss = group_loss.item() / dp
        if root:
            log.add(step, sharded_loss, single_loss, ms, comms)
    first = ((args.steps - 1) * dp * BATCH) % FIELDS
    return report(args, root, prediction, single_prediction, log, targets, mesh_text, first_field=first)


def sharded_step(model, opt, u, target, mesh, layout, sizes):
    """One training step on the field split by `layout`: (prediction, loss, ms, collectives)."""
    su = st.distribute_tensor(u, mesh, layout, sharding_shapes=sizes)
    starget = st.distribute_tensor(target, mesh, layout, sharding_shapes=sizes)
    with st.CommDebugMode() as comms:
        t0 = time.perf_counter()
        opt.zero_grad()
        prediction = model(su)
        loss = F.mse_loss(prediction, starget)
        loss.backward()
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
    return prediction.detach(), loss, ms, comms


class LossLog:
    """Rank 0's record of both runs, step by step: prints each row of the table and keeps the
    losses, the worst relative difference and step 0's collectives."""

    def __init__(self):
        self.sharded, self.single, self.worst, self.first_table = [], [], 0.0, None

    def add(self, step, sharded_loss, single_loss, ms, comms):
        rel = abs(sharded_loss - single_loss) / abs(single_loss)
        self.worst = max(self.worst, rel)
        self.sharded.append(sharded_loss)
        self.single.append(single_loss)
        print(f"{step:5d}  {sharded_loss:13.6e}  {single_loss:13.6e}  {rel:10.2e}  {ms:8.1f}  "
              f"{comms.get_total_counts():11d}", flush=True)
        if step == 0:
            self.first_table = (comms.get_comm_counts(), comms.table())


def report(args, root, prediction, single_prediction, log, targets, mesh_text, first_field=None) -> int:
    """Checks the final prediction against one process's, prints the summary, writes the figures;
    every rank exits with rank 0's verdict."""
    # The final prediction, gathered (a collective: every rank takes part), against one process's.
    shard_sizes = prediction.shard_sizes()
    full_prediction = prediction.full_tensor()
    ok = True
    if root:
        counts, table = log.first_table
        worst = log.worst
        print(f"collectives of step 0 by kind: {counts}")
        print(table)
        pred_rel = ((full_prediction - single_prediction).abs().max() / single_prediction.abs().max()).item()
        print(f"final prediction: placements {prediction.placements}, shard sizes {shard_sizes}; "
              f"max |sharded - single| / max |single| = {pred_rel:.2e}")
        print(f"largest relative loss difference over {args.steps} steps: {worst:.3e}")
        fallbacks = st.fallback_operators()
        print(f"operators that fell back to gathering: {fallbacks if fallbacks else 'none'}")
        if worst > TOLERANCE:
            print(f"FAILED: a step's relative loss difference {worst:.3e} exceeds {TOLERANCE}", file=sys.stderr)
            ok = False
        if not pred_rel <= TOLERANCE:
            print(f"FAILED: the final prediction differs from one process's by {pred_rel:.3e} (relative)",
                  file=sys.stderr)
            ok = False
        first = ((args.steps - 1) * BATCH) % FIELDS if first_field is None else first_field
        paths = write_figures(args.out, targets[first, 0], full_prediction[0, 0], shard_sizes, log.sharded,
                              log.single, mesh_text)
        for path, what in paths:
            print(f"wrote {path} ({what})")
    # Every rank exits with rank 0's verdict.
    verdict = torch.tensor([1 if ok else 0], dtype=torch.int64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast(verdict, src=0)
    return 0 if verdict.item() == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
