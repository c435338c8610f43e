"""What PhysicsNeMo's handlers and DTensor's register_sharding cost the operators that do not use
them, and what a register_sharding rule costs on a propagation-cache hit. Results: bench/RESULTS.md.

    .venv/bin/shardrun -n 2 .venv/bin/python bench/handler_overhead.py [--json FILE]

1. Per-op time from Python on a ShardTensor (8x8 local pieces, Shard(0), cache warm) with no
   handler registered, and with a dispatch handler for another operator (aten::special_i0e) and
   a function handler for another function (F.softsign) registered: the two states take turns
   in every round (registering and removing between them), median over the rounds of the mean
   of a timeit loop. The bar: unchanged beyond noise.
2. A register_sharding rule on a cache hit against the built-in C++ rule of the same operator
   (aten::neg): neg timed with its C++ rule, then with a Python rule of the same layouts, with
   aten::abs (whose rule never changes) timed alongside as the control for drift. The bar:
   within 0.3 us of the C++ rule.

Rank 0 times while the others wait at a barrier.
"""

import argparse
import json
import statistics
import timeit

import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardtensor as st
from shardtensor import _dtensor_operands
from shardtensor import ShardTensor

_dtensor_operands.uninstall()  # torch's DTensor timed as torch ships it, without shardtensor's operand check

OPS = {
    "x + y": lambda x, y: x + y,
    "x * y": lambda x, y: x * y,
    "relu(x)": lambda x, y: torch.relu(x),
    "neg(x)": lambda x, y: torch.neg(x),
    "x.sum(0)": lambda x, y: x.sum(0),
}


def per_call_us(fn, number):
    return timeit.timeit(fn, number=number) / number * 1e6


def register_others():
    ShardTensor.register_dispatch_handler(torch.ops.aten.special_i0e.default, lambda t: t)
    ShardTensor.register_function_handler(F.softsign, lambda func, types, args, kwargs: args[0])


def remove_others():
    ShardTensor._dispatch_registry.clear()
    ShardTensor._function_registry.clear()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--number", type=int, default=2000, help="calls per timeit loop")
    p.add_argument("--rounds", type=int, default=61, help="rounds (each times every state once)")
    p.add_argument("--json", help="rank 0 writes the figures here")
    args = p.parse_args()

    mesh = st.init_device_mesh("cpu", (dist.get_world_size() if dist.is_initialized() else st._C.world_size(),))
    n = mesh.size()
    x = st.distribute_tensor(torch.randn(8 * n, 8), mesh, [st.Shard(0)])
    y = st.distribute_tensor(torch.randn(8 * n, 8), mesh, [st.Shard(0)])
    results = {"world_size": n, "ops": {}, "register_sharding": {}, "torch": torch.__version__,
               "number": args.number, "rounds": args.rounds}
    if mesh.get_rank() == 0:
        for name, op in OPS.items():
            fn = lambda: op(x, y)  # noqa: E731
            for _ in range(3):
                fn()
            plain, other = [], []
            for _ in range(args.rounds):
                plain.append(per_call_us(fn, args.number))
                register_others()
                fn()
                other.append(per_call_us(fn, args.number))
                remove_others()
            results["ops"][name] = {"none": statistics.median(plain), "others": statistics.median(other),
                                    "none_all": plain, "others_all": other}

        neg = lambda: torch.neg(x)  # noqa: E731
        control = lambda: torch.abs(x)  # noqa: E731
        phases = {}
        for phase in ("cxx", "python"):
            if phase == "python":
                @st.register_sharding(torch.ops.aten.neg.default)
                def neg_sharding(t):
                    return [([st.Shard(d)], [st.Shard(d)]) for d in range(t.ndim)] + [([st.Replicate()], [st.Replicate()])]
            for _ in range(3):
                neg(), control()
            samples = {"neg": [], "abs": []}
            for _ in range(args.rounds):
                samples["neg"].append(per_call_us(neg, args.number))
                samples["abs"].append(per_call_us(control, args.number))
            phases[phase] = {k: statistics.median(v) for k, v in samples.items()}
            phases[phase].update({f"{k}_min": min(v) for k, v in samples.items()})
        assert torch.neg(x).placements == x.placements
        results["register_sharding"] = phases
        # Differences in differences: neg's change minus the control's, of the medians and of the
        # minima (on a VM whose slow spells come and go, the minimum is the steadier figure).
        delta = (phases["python"]["neg"] - phases["python"]["abs"]) - (phases["cxx"]["neg"] - phases["cxx"]["abs"])
        delta_min = ((phases["python"]["neg_min"] - phases["python"]["abs_min"])
                     - (phases["cxx"]["neg_min"] - phases["cxx"]["abs_min"]))

        print(f"## Handlers and register_sharding ({n} ranks, 8x8 local pieces, median of {args.rounds} rounds "
              f"of {args.number} calls)\n")
        print("| op | no handler (us) | handlers for other ops (us) | difference (us) |")
        print("|---|---:|---:|---:|")
        for name, r in results["ops"].items():
            print(f"| `{name}` | {r['none']:.2f} | {r['others']:.2f} | {r['others'] - r['none']:+.2f} |")
        print()
        print("| aten::neg on a cache hit | neg (us) | control abs (us) |")
        print("|---|---:|---:|")
        print(f"| built-in C++ rule | {phases['cxx']['neg']:.2f} | {phases['cxx']['abs']:.2f} |")
        print(f"| register_sharding rule | {phases['python']['neg']:.2f} | {phases['python']['abs']:.2f} |")
        print(f"\nregister_sharding minus C++ rule, drift-corrected: {delta:+.2f} us of the medians, "
              f"{delta_min:+.2f} us of the minima (bar: within 0.30 us)")
        results["register_sharding"]["delta_us"] = delta
        results["register_sharding"]["delta_min_us"] = delta_min
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
