"""Collectives per operation (counts, not times): shardtensor next to torch's DTensor on the same
program, and next to the minimum the layout needs. Results: bench/RESULTS.md.

    .venv/bin/shardrun -n 4 .venv/bin/python bench/collectives_per_op.py [--json FILE]

Each case runs once per library under its own CommDebugMode (shardtensor's st.CommDebugMode,
torch's torch.distributed.tensor.debug.CommDebugMode), after a warm-up call, and its result is
checked against one process first (a wrong answer is reported, never counted). Sizes divide by
the mesh, so that DTensor runs every case; shardtensor's counts are the same on uneven sizes
(tests/python/test_parity.py and tests/dist/partial_test.cpp check that, on uneven splits and
empty pieces). "minimum" is the fewest collectives the layout allows, argued in each case's note.

--json FILE: rank 0 writes the rows to FILE for bench/regenerate.py. --before FILE adds a
"before" column from an earlier run's --json (the same program run on an older build).
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

import shardtensor as st
from shardtensor import _dtensor_operands

_dtensor_operands.uninstall()  # torch's DTensor timed as torch ships it, without shardtensor's operand check


class Library:
    """What a case needs from shardtensor or DTensor: distribute_tensor and the placements."""

    def __init__(self, distribute, shard, replicate, partial, mesh, comm_debug_mode):
        self.distribute, self.Shard, self.Replicate, self.Partial = distribute, shard, replicate, partial
        self.mesh, self.CommDebugMode = mesh, comm_debug_mode

    def counted(self, setup, op):
        """op(*setup(self)) under the library's CommDebugMode, after one warm-up call (its
        propagation cache); the inputs are made outside the count."""
        op(*setup(self))
        inputs = setup(self)
        with self.CommDebugMode() as comms:
            out = op(*inputs)
        return out, comms.get_total_counts()


def full_of(t):
    return t.full_tensor() if hasattr(t, "full_tensor") and hasattr(t, "placements") else t


def cases(world):
    """(name, minimum, note, setup(lib) -> inputs, op(*inputs) -> tensor, one process's result)."""
    torch.manual_seed(0)
    rows = 4 * world
    g = torch.randn(rows, 6, dtype=torch.float64)
    w = torch.randn(6, 5, dtype=torch.float64)
    table = torch.randn(2 * world, 4, dtype=torch.float64)
    idx = torch.tensor([[1, 2 * world - 1, 0], [world, 3, 2]])
    ln_w, ln_b = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    ref_w = ln_w.clone().requires_grad_(True)
    F.layer_norm(g, (6,), ref_w, ln_b).sum().backward()

    def noop_redistribute_backward(x, y, cotangent):
        return torch.autograd.grad(y, x, cotangent)[0]

    def noop_setup(lib):
        x = lib.distribute(g.clone().requires_grad_(True), lib.mesh, [lib.Partial()])
        return x, x.redistribute(lib.mesh, [lib.Partial()]), lib.distribute(torch.ones_like(g), lib.mesh, [lib.Partial()])

    def layer_norm_setup(lib):
        return (lib.distribute(g.clone().requires_grad_(True), lib.mesh, [lib.Shard(0)]),
                lib.distribute(ln_w.clone().requires_grad_(True), lib.mesh, [lib.Replicate()]),
                lib.distribute(ln_b.clone().requires_grad_(True), lib.mesh, [lib.Replicate()]))

    def layer_norm_weight_grad(x, wt, bt):
        return torch.autograd.grad(F.layer_norm(x, (6,), wt, bt).sum(), (x, wt, bt))[1]

    grads = [torch.randn(2 * world, 3, dtype=torch.float64), torch.randn(3, world + 1, dtype=torch.float64)]

    def clip_setup(lib):
        params = []
        for grad, placement in zip(grads, (lib.Shard(0), lib.Shard(0))):
            p = torch.nn.Parameter(lib.distribute(torch.zeros_like(grad), lib.mesh, [placement]))
            p.grad = lib.distribute(grad, lib.mesh, [placement])
            params.append(p)
        return (params,)

    def clip(params):
        return torch.nn.utils.clip_grad_norm_(params, max_norm=0.5)

    def refused(lib):
        # Shard(5) of a 2-d tensor: wrong on every rank alike. The count is what runs before the
        # error; the oracle is the argument itself, returned once the error is seen.
        try:
            lib.distribute(g, lib.mesh, [lib.Shard(5)])
        except Exception:  # DTensor raises an AssertionError, shardtensor a ValueError
            return g
        raise AssertionError("Shard(5) of a 2-d tensor was accepted")

    return [
        ("distribute_tensor with Shard(5) of a 2-d tensor (raises)", 0,
         "wrong on every rank alike; shardtensor's all-gather (one per mesh dim) lets a rank alone with a wrong "
         "argument make every rank raise, and no text follows it when all ranks failed", lambda lib: (lib,), refused, g),
        ("distribute_tensor, src_data_rank=None, [Shard(0)]", 0, "no byte moves",
         lambda lib: (lib,), lambda lib: lib.distribute(g, lib.mesh, [lib.Shard(0)], src_data_rank=None), g),
        ("distribute_tensor, [Shard(0)] from rank 0", 1,
         "one scatter; shardtensor adds an all-gather of 3 integers so that ranks passing different tensors raise "
         "(README, differences from DTensor)",
         lambda lib: (lib,), lambda lib: lib.distribute(g, lib.mesh, [lib.Shard(0)]), g),
        ("P(avg) @ R (mm)", 0, "avg is linear: the product stays pending",
         lambda lib: (lib.distribute(g, lib.mesh, [lib.Partial("avg")]), lib.distribute(w, lib.mesh, [lib.Replicate()])),
         lambda a, b: a @ b, g @ w),
        ("amax(dim=1) of P(max)", 0, "max of maxima: stays pending",
         lambda lib: (lib.distribute(g, lib.mesh, [lib.Partial("max")]),), lambda a: a.amax(1), g.amax(1)),
        ("amin(dim=1) of P(min)", 0, "min of minima: stays pending",
         lambda lib: (lib.distribute(g, lib.mesh, [lib.Partial("min")]),), lambda a: a.amin(1), g.amin(1)),
        ("stack([P(sum), R])", 0, "R joins a pending sum on one coordinate",
         lambda lib: (lib.distribute(g, lib.mesh, [lib.Partial()]), lib.distribute(g, lib.mesh, [lib.Replicate()])),
         lambda a, b: torch.stack([a, b]), torch.stack([g, g])),
        ("vector_norm of S(0) (whole tensor)", 0, "a pending reduction of powers (DTensor's norm Partial)",
         lambda lib: (lib.distribute(g, lib.mesh, [lib.Shard(0)]),), lambda a: torch.linalg.vector_norm(a),
         torch.linalg.vector_norm(g)),
        ("clip_grad_norm_ of two S(0) gradients", 1,
         "the gradients' norms and their norm stay pending norms; the clipping factor reads the total once",
         clip_setup, clip, torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in grads]))),
        ("embedding on a vocab-sharded table S(0)", 0, "each rank looks up its own rows: a masked Partial(sum)",
         lambda lib: (lib.distribute(idx, lib.mesh, [lib.Replicate()]), lib.distribute(table, lib.mesh, [lib.Shard(0)])),
         lambda i, t: F.embedding(i, t), F.embedding(idx, table)),
        ("gather(dim=0) on S(0) by a whole index", 0, "each rank answers its own rows: a masked Partial(sum)",
         lambda lib: (lib.distribute(table, lib.mesh, [lib.Shard(0)]), lib.distribute(idx[:, :2].repeat(1, 2), lib.mesh, [lib.Replicate()])),
         lambda t, i: torch.gather(t, 0, i), torch.gather(table, 0, idx[:, :2].repeat(1, 2))),
        ("index_select(dim=0) on S(0) by a whole index", 0, "each rank answers its own rows: a masked Partial(sum)",
         lambda lib: (lib.distribute(table, lib.mesh, [lib.Shard(0)]), lib.distribute(idx.flatten(), lib.mesh, [lib.Replicate()])),
         lambda t, i: torch.index_select(t, 0, i), torch.index_select(table, 0, idx.flatten())),
        ("histc(min=0, max=3) of S(0) (int bounds)", 0, "local counts, a pending sum",
         lambda lib: (lib.distribute(g.abs(), lib.mesh, [lib.Shard(0)]),), lambda a: torch.histc(a, bins=4, min=0, max=3),
         torch.histc(g.abs(), bins=4, min=0, max=3)),
        ("backward of a P(sum) -> P(sum) redistribute", 0, "a copy: the gradient passes through",
         noop_setup, noop_redistribute_backward, torch.ones_like(g)),
        ("layer_norm forward + backward on row shards S(0)", 0,
         "rows are whole on each rank; weight and bias gradients stay pending sums",
         layer_norm_setup, layer_norm_weight_grad, ref_w.grad),
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--before", metavar="FILE", help="an earlier run's --json, shown as a 'before' column")
    p.add_argument("--no-dtensor", action="store_true", help="shardtensor only (for a run on an older build)")
    args = p.parse_args()
    mesh = st.init_device_mesh("cpu", (torch.distributed.get_world_size() if torch.distributed.is_initialized()
                                       else int(__import__("os").environ.get("WORLD_SIZE", "1")),))
    world = mesh.size()
    torch_mesh = mesh.to_torch()
    before = {}
    if args.before:
        with open(args.before) as f:
            before = {row["case"]: row["shardtensor"] if row.get("shardtensor") is not None
                      else f"failed: {(row.get('shardtensor_error') or '')[:60]}" for row in json.load(f)["rows"]}
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    libraries = {"shardtensor": Library(st.distribute_tensor, st.Shard, st.Replicate, st.Partial, mesh, st.CommDebugMode)}
    if not args.no_dtensor:
        libraries["dtensor"] = Library(distribute_tensor, Shard, Replicate, Partial, torch_mesh, CommDebugMode)
    rows = []
    for name, minimum, note, setup, op, oracle in cases(world):
        row = {"case": name, "minimum": minimum, "note": note}
        for key, lib in libraries.items():
            try:
                result, count = lib.counted(setup, op)
                torch.testing.assert_close(full_of(result), oracle)  # a wrong answer is reported, not counted
                row[key] = count
                if key == "shardtensor":
                    row["placements"] = str(tuple(result.placements)) if isinstance(result, st.ShardTensor) else "(raised)"
            except Exception as e:
                row[key] = None
                row[key + "_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        if name in before:
            row["before"] = before[name]
        rows.append(row)
    if mesh.get_rank() == 0:
        header = "| case | minimum | " + ("before | " if before else "") + "shardtensor | DTensor | shardtensor's output |"
        print(header)
        print("|" + "---|" * (header.count("|") - 1))
        for r in rows:
            b = f"{r.get('before', 'n/a')} | " if before else ""
            print(f"| {r['case']} | {r['minimum']} | {b}{r.get('shardtensor', r.get('shardtensor_error'))} | "
                  f"{r.get('dtensor', r.get('dtensor_error'))} | {r.get('placements', '')} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"bench": "collectives_per_op", "world_size": world, "torch": torch.__version__,
                           "shardtensor": st.__version__, "rows": rows}, f, indent=1)
    failed = [r for r in rows if r.get("shardtensor") is None]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
