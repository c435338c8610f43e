"""torch's OpInfo database run on ShardTensors and compared with one process, the way torch tests
DTensor (test/distributed/tensor/test_dtensor_ops.py runs `op_db`).

    .venv/bin/python tests/python/opinfo_sweep.py                 # every op, world size 3
    .venv/bin/python tests/python/opinfo_sweep.py --ops squeeze,unfold --world-size 2

For every op of `torch.testing._internal.common_methods_invocations.op_db`, up to
`SAMPLES_PER_OP` float32 CPU sample inputs; each tensor argument of a sample in turn is distributed
as Shard(0), Shard(-1) and Replicate() (torch.chunk's split, so uneven at world size 3), the others
stay plain; the op runs on it and every output (and every argument the op writes into) is
compared with the same op on plain tensors. Fallbacks are allowed (not strict mode): a missing
rule is slow, not wrong.

Each case ends as one of
    ok          values equal one process's
    wrong       a value differs (the one outcome no layout may ever give)
    error       a clear exception, the same on every rank
    disagree    ranks ended differently (one raised, another did not, or raised something else)
    internal    an internal assert or torch's storage-access error reached the user
    crash       a rank died (a signal) or hung past `CASE_TIMEOUT_S`

A crash ends the ranks; the sweep starts them again after the case that crashed, so one crash
costs one case, not the sweep. `run_sweep` returns the cases; `main` prints a table.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PLACEMENTS = ("Shard(0)", "Shard(-1)", "Replicate()")
SAMPLES_PER_OP = 3
CASE_TIMEOUT_S = 60
SEED = 1234

# Ops whose results are not a function of their inputs, so no oracle can check their values:
# random draws, and uninitialised memory.
RANDOM_OR_UNINITIALISED = (
    "bernoulli", "normal", "rand", "randn", "randint", "multinomial", "uniform", "cauchy", "exponential",
    "geometric", "log_normal", "poisson", "dropout", "rrelu", "empty", "new_empty", "empty_like",
    "empty_strided", "empty_permuted", "new_empty_strided", "nn.functional.feature_alpha_dropout",
    "nn.functional.alpha_dropout", "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "torch.ops.aten._efficient_attention_forward", "nn.functional.scaled_dot_product_attention",
    "item", "bincount", "unique", "unique_consecutive",
    # Its samples train with dropout_p 0.5: OpInfo seeds torch's generator, which ShardTensor
    # random ops do not draw from (st.manual_seed seeds them; issue 76 asks for torch.manual_seed).
    "nn.functional.multi_head_attention_forward",
)

# What a message holds when the library lost control: an internal assert, or torch reading the
# storage of a tensor that has none (a ShardTensor handed to a kernel that needs real memory).
_INTERNAL_MARKERS = ("INTERNAL ASSERT FAILED", "doesn't have storage", "Cannot access storage", "Cannot access data pointer")


def _is_random(name: str) -> bool:
    return any(name == r or name.startswith(r + "_") or f".{r}" in name or r in name.split(".")[-1].split("_")
               for r in RANDOM_OR_UNINITIALISED)


def _ops(selected):
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        full = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if selected and op.name not in selected and full not in selected:
            continue
        if _is_random(op.name):
            continue
        yield full, op


def _tensor_paths(sample):
    """Where the sample's tensors are: ("input",), ("input", i), ("args", i), ("kwargs", key)."""
    import torch

    paths = []
    if isinstance(sample.input, torch.Tensor):
        paths.append(("input",))
    elif isinstance(sample.input, (list, tuple)):
        paths += [("input", i) for i, t in enumerate(sample.input) if isinstance(t, torch.Tensor)]
    paths += [("args", i) for i, a in enumerate(sample.args) if isinstance(a, torch.Tensor)]
    paths += [("kwargs", k) for k, v in sample.kwargs.items() if isinstance(v, torch.Tensor)]
    return paths


def _get(sample_parts, path):
    inp, args, kwargs = sample_parts
    if path[0] == "input":
        return inp if len(path) == 1 else inp[path[1]]
    return args[path[1]] if path[0] == "args" else kwargs[path[1]]


def _replace(sample_parts, path, value):
    inp, args, kwargs = sample_parts
    if path[0] == "input":
        if len(path) == 1:
            inp = value
        else:
            inp = type(inp)(value if i == path[1] else t for i, t in enumerate(inp))
    elif path[0] == "args":
        args = tuple(value if i == path[1] else a for i, a in enumerate(args))
    else:
        kwargs = {**kwargs, path[1]: value}
    return inp, args, kwargs


def _cloned(sample):
    import torch
    from torch.utils._pytree import tree_map

    def clone(x):
        return x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x

    return tree_map(clone, sample.input), tree_map(clone, tuple(sample.args)), tree_map(clone, dict(sample.kwargs))


def _cases(op, samples_per_op):
    """(sample index, path, placement) of every case of one op, the same list on every rank."""
    import torch

    torch.manual_seed(SEED)
    samples = []
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd):
        samples.append(sample)
        if len(samples) == samples_per_op:
            break
    cases = []
    for si, sample in enumerate(samples):
        for path in _tensor_paths(sample):
            t = _get((sample.input, sample.args, sample.kwargs), path)
            if t.layout != torch.strided:
                continue
            for placement in PLACEMENTS:
                if placement.startswith("Shard") and t.dim() == 0:
                    continue
                cases.append((si, path, placement))
    return samples, cases


def _global(x):
    import shardtensor as st
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: v.full_tensor() if isinstance(v, st.ShardTensor) else v, x)


def _compare(actual, expected) -> str | None:
    """None when equal; else what differs."""
    import torch
    from torch.utils._pytree import tree_flatten

    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    if a_spec != e_spec:
        return f"structure {a_spec} != {e_spec}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"output {i}: {type(a).__name__} where one process gives a tensor"
            if a.shape != e.shape or a.dtype != e.dtype:
                return f"output {i}: shape {tuple(a.shape)} {a.dtype} != {tuple(e.shape)} {e.dtype}"
            if a.dtype.is_floating_point and a.dtype.itemsize == 1:  # float8: torch compares those bitwise
                a, e = a.double(), e.double()
            try:
                torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5, equal_nan=True, check_device=False)
            except AssertionError as err:
                return f"output {i}: " + " ".join(str(err).split())[:300]
        elif a != e and not (isinstance(e, float) and e != e and a != a):
            return f"output {i}: {a!r} != {e!r}"
    return None


def _run_case(op, sample, path, placement, mesh):
    """(outcome, detail) of one case on this rank."""
    import torch

    import shardtensor as st

    parts = _cloned(sample)
    try:
        expected = op.op(parts[0], *parts[1], **parts[2])
    except Exception:  # noqa: BLE001 - torch itself refuses this sample: nothing to compare
        return "skipped", "one process raises"
    written_expected = parts

    parts = _cloned(sample)
    local = _get(parts, path)
    shard = {"Shard(0)": st.Shard(0), "Shard(-1)": st.Shard(-1), "Replicate()": st.Replicate()}[placement]
    parts = _replace(parts, path, st.distribute_tensor(local, mesh, [shard]))
    try:
        actual = op.op(parts[0], *parts[1], **parts[2])
        actual = _global(actual)
        written = _global(parts)
    except Exception as err:  # noqa: BLE001 - every failure is an outcome of the sweep
        text = " ".join(f"{type(err).__name__}: {err}".split())
        kind = "internal" if any(m in text for m in _INTERNAL_MARKERS) else "error"
        return kind, text[:400]
    diff = _compare(actual, expected)
    if diff is None:
        diff = _compare(written, written_expected)
        diff = diff and "argument written: " + diff
    return ("wrong", diff) if diff else ("ok", "")


def _sweep_body(rank, world_size, selected, samples_per_op, start, progress_dir, out_path):
    import faulthandler

    import torch
    import torch.distributed as dist

    import shardtensor as st

    st.set_strict(False)
    mesh = st.init_device_mesh("cpu", (world_size,))
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    progress = os.path.join(progress_dir, f"rank{rank}")
    first_op, skip_through = start
    for op_index, (name, op) in enumerate(_ops(selected)):
        if op_index < first_op:
            continue
        samples, cases = _cases(op, samples_per_op)
        for case_index, (si, path, placement) in enumerate(cases):
            if op_index == first_op and case_index <= skip_through:
                continue
            with open(progress, "w") as f:
                json.dump([op_index, case_index, name, si, list(path), placement], f)
            faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
            outcome = _run_case(op, samples[si], path, placement, mesh)
            faulthandler.cancel_dump_traceback_later()
            everyone = [None] * world_size
            dist.all_gather_object(everyone, outcome)
            kinds = {k for k, _ in everyone}
            if len(kinds) > 1:
                kind = "disagree"
            else:
                kind = everyone[0][0]
            if rank == 0:
                detail = "; ".join(f"rank {r}: {k} {d}" for r, (k, d) in enumerate(everyone)) if kind == "disagree" \
                    else everyone[0][1]
                with open(out_path, "a") as f:
                    f.write(json.dumps({"op": name, "sample": si, "arg": "/".join(map(str, path)),
                                        "placement": placement, "outcome": kind, "detail": detail}) + "\n")
            if kind == "disagree" or any("timed out" in d or "gave up" in d for _, d in everyone):
                # The ranks may have left an exchange half done: start them again.
                raise SystemExit(3)
        torch.manual_seed(SEED)


def run_sweep(world_size=3, selected=None, out_path=None, samples_per_op=SAMPLES_PER_OP, timeout=3600.0):
    """Runs the sweep; returns its cases as dicts (op, sample, arg, placement, outcome, detail)."""
    from ranks import run_ranks

    work = tempfile.mkdtemp(prefix="opinfo_sweep_")
    out_path = out_path or os.path.join(work, "cases.jsonl")
    open(out_path, "w").close()
    start = (0, -1)
    while True:
        try:
            run_ranks(_sweep_body, world_size, selected, samples_per_op, start, work, out_path, timeout=timeout)
            break
        except AssertionError as err:
            where = [json.load(open(os.path.join(work, f))) for f in os.listdir(work) if f.startswith("rank")]
            if not where:
                raise
            op_index, case_index, name, si, path, placement = max(where)
            done = [json.loads(line) for line in open(out_path)]
            recorded = any(c["op"] == name and c["sample"] == si and c["arg"] == "/".join(map(str, path))
                           and c["placement"] == placement for c in done)
            if not recorded:
                with open(out_path, "a") as f:
                    f.write(json.dumps({"op": name, "sample": si, "arg": "/".join(map(str, path)),
                                        "placement": placement, "outcome": "crash",
                                        "detail": " ".join(str(err).split())[-400:]}) + "\n")
            if start == (op_index, case_index):
                raise
            start = (op_index, case_index)
    return [json.loads(line) for line in open(out_path)]


def summary(cases) -> str:
    by_outcome = collections.Counter(c["outcome"] for c in cases)
    ops_by_outcome = collections.defaultdict(set)
    for c in cases:
        ops_by_outcome[c["outcome"]].add(c["op"])
    lines = ["| outcome | cases | ops |", "|---|---|---|"]
    for kind in ("ok", "wrong", "error", "disagree", "internal", "crash", "skipped"):
        lines.append(f"| {kind} | {by_outcome.get(kind, 0)} | {len(ops_by_outcome.get(kind, ()))} |")
    for kind in ("wrong", "crash", "internal", "disagree", "error"):
        for c in cases:
            if c["outcome"] == kind:
                lines.append(f"{kind}: {c['op']} sample {c['sample']} {c['arg']} {c['placement']}: {c['detail'][:300]}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--ops", default="", help="comma-separated OpInfo names (default: every op)")
    parser.add_argument("--samples", type=int, default=SAMPLES_PER_OP, help="sample inputs per op")
    parser.add_argument("--out", default=None, help="where to write the cases, one JSON object a line")
    args = parser.parse_args()
    selected = set(filter(None, args.ops.split(",")))
    cases = run_sweep(args.world_size, selected or None, args.out, args.samples)
    print(summary(cases))


if __name__ == "__main__":
    main()
