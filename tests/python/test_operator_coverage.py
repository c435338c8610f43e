"""Operator coverage measured from torch itself: every ATen overload that the installed torch's
DTensor has a sharding strategy for is served by shardtensor, or is named in one table of
fallbacks with the reason it gathers.

Served means one of:
    rule          a sharding rule under the overload's own name (rules/registry.h)
    out=          an out= overload: it runs its functional overload and writes into `out`
    above autograd  a kernel of shardtensor's own on the autograd key: the _foreach_ operators
                  (one per-tensor call per element), the fused optimizer steps and GradScaler's
                  unscale (dispatch/foreach.h, dispatch/fused_steps.h), decompositions
    in place      the operators that change a ShardTensor's shape in place, each with its own
                  kernel (dispatch/in_place_shape.h), and detach_, which autograd serves whole
    decomposes    a CompositeImplicitAutograd operator: it never reaches shardtensor, its parts do
    prims         torch's primitives, reached only inside traced decompositions, never eagerly

Anything else falls back to gathering (correct, warned once per operator, an error in strict
mode), and must be in FALLBACKS with its reason, so that the table is the whole list of what is
slow; a table entry that gains a rule fails the test until it is taken out.
"""

import collections

import pytest
import torch

import shardtensor as st
from ranks import run_ranks

# Reason -> overloads. What gathers today, and why no rule serves it yet.
FALLBACKS = {
    "solves and factorisations with several operands (a right-hand side, pivots, Householder "
    "factors) whose batch dims no rule aligns yet; each matrix is read whole in any case": (
        "aten::_linalg_solve_ex", "aten::cholesky_solve", "aten::linalg_householder_product",
        "aten::linalg_ldl_solve", "aten::linalg_lu_solve", "aten::linalg_pinv.atol_rtol_tensor",
        "aten::linalg_solve_triangular", "aten::lu_unpack", "aten::ormqr", "aten::triangular_solve",
        "aten::linalg_cross", "aten::linalg__powsum"),
    "FFT reads every element of the transformed dims: no rule yet keeps the other dims' shards": (
        "aten::_fft_c2c", "aten::_fft_c2r", "aten::_fft_r2c"),
    "the functional forms of in-place kernels (what functionalization emits when tracing; eager "
    "programs call the in-place forms, which are served)": (
        "aten::_fused_adam", "aten::_fused_adam.tensor_lr", "aten::_fused_adamw", "aten::_fused_adamw.tensor_lr",
        "aten::_batch_norm_with_update_functional", "aten::_native_batch_norm_legit_functional",
        "aten::normal_functional", "aten::rrelu_with_noise_functional"),
    "GPU kernels without a sharding rule yet (grouped and scaled matmuls, fused RMSNorm's backward)": (
        "aten::_fused_rms_norm_backward", "aten::_grouped_mm", "aten::_scaled_mm"),
    "backward of anti-aliased resampling: its input_size argument names the whole batch": (
        "aten::_upsample_bicubic2d_aa_backward", "aten::_upsample_bilinear2d_aa_backward",
        "aten::_upsample_lanczos2d_aa_backward"),
    "scatters into diagonals and slices, and diagonal embedding, place values across a split": (
        "aten::diag_embed", "aten::diagonal_scatter", "aten::select_scatter", "aten::slice_scatter"),
    "in-place matmuls: a contraction split across ranks yields a pending sum, which the tensor "
    "written into cannot hold": ("aten::addmm_", "aten::baddbmm_"),
    "nansum of a pending sum differs from the pending nansums (NaN in one term); two-output frexp; "
    "random rrelu": ("aten::nansum", "aten::frexp.Tensor", "aten::rrelu_with_noise"),
}


# dispatch/in_place_shape.h's operators, and detach_ (autograd's kernel, no backend call).
IN_PLACE = {"aten::t_", "aten::transpose_", "aten::unsqueeze_", "aten::squeeze_", "aten::squeeze_.dim",
            "aten::squeeze_.dims", "aten::detach_"}


def _dtensor_overloads():
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    tables = [propagator.op_strategy_funcs, propagator.op_to_rules,
              getattr(propagator, "op_single_dim_strategy_funcs", {})]
    return {op for table in tables for op in table if isinstance(op, torch._ops.OpOverload)}


def how_served(op, rules) -> str | None:
    name = op.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if name in rules:
        return "rule"
    if any(a.is_out for a in op._schema.arguments):
        return "out="
    if has(name, "AutogradPrivateUse1"):
        return "above autograd"
    if name in IN_PLACE:
        return "in place"
    if has(name, "CompositeImplicitAutograd"):
        return "decomposes"
    if name.startswith("prims::"):
        return "prims"
    return None


def test_every_overload_dtensor_covers_is_served_or_a_reasoned_fallback():
    rules = set(st._C.sharding_rule_names())
    listed = collections.Counter(name for names in FALLBACKS.values() for name in names)
    assert not [n for n, k in listed.items() if k > 1], "an overload is listed twice"
    counts = collections.Counter()
    unaccounted, listed_but_served = [], []
    for op in sorted(_dtensor_overloads(), key=lambda o: o.name()):
        how = how_served(op, rules)
        if how is None and op.name() not in listed:
            unaccounted.append(op.name())
        if how is not None and op.name() in listed:
            listed_but_served.append(f"{op.name()} ({how})")
        counts[how or "fallback (table)"] += 1
    print(f"DTensor's overloads: {sum(counts.values())}; " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    assert not unaccounted, f"served by no rule and not in FALLBACKS: {unaccounted}"
    assert not listed_but_served, f"in FALLBACKS but served (take them out of the table): {listed_but_served}"


# Integer operators the OpInfo sweep's float samples cannot reach: values and layouts in strict
# mode (no fallback) at world size 3, uneven, against one process.
_INTEGER_OPS = [
    ("bitwise_and", lambda a, b: a & b), ("bitwise_or", lambda a, b: a | b), ("bitwise_xor", lambda a, b: a ^ b),
    ("left_shift", lambda a, b: a << (b % 4)), ("right_shift", lambda a, b: a >> (b % 4)),
    ("scalar_and", lambda a, b: 6 & a), ("scalar_shift", lambda a, b: a << 2),
    ("gcd", torch.gcd), ("lcm", torch.lcm),
]


def integer_ops_body(rank, world_size):
    mesh = st.init_device_mesh("cpu", (world_size,))
    a = torch.arange(1, 8 * 5 + 1).reshape(8, 5)
    b = (a * 7 + 3) % 11 + 1
    for placements in ([st.Shard(0)], [st.Shard(1)], [st.Replicate()]):
        sa, sb = (st.distribute_tensor(t, mesh, placements) for t in (a, b))
        with st.strict():
            for name, f in _INTEGER_OPS:
                out = f(sa, sb)
                assert out.placements == tuple(placements), (name, out.placements)
                torch.testing.assert_close(out.full_tensor(), f(a, b), msg=f"{name} on {placements}")
            inplace = sa.clone()
            inplace &= sb
            torch.testing.assert_close(inplace.full_tensor(), a & b, msg=f"&= on {placements}")


@pytest.mark.parametrize("world_size", [3])
def test_integer_operators_have_rules(world_size):
    run_ranks(integer_ops_body, world_size)
