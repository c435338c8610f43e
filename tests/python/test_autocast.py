"""Issue 76, autocast: an operator on ShardTensors under torch.autocast computes in the dtype
autocast gives the same operator on plain tensors, with the same values (bf16 on CPU).

- per operator, on every list autocast keeps (lower precision, fp32, promotion) and off them,
  its inputs split, replicated and plain beside ShardTensors;
- autocast(enabled=False) inside an autocast region, and nested regions;
- a tensor-parallel MLP (Colwise / Rowwise) forward and backward under autocast, against the
  same model on one process under autocast: output dtype, values, and the fp32 parameters'
  gradients.
World sizes 1-4 on uneven splits.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from oracle import assert_close
from ranks import run_ranks
from test_parallel_api import MLP  # DTensor's tutorial MLP

WORLD_SIZES = [1, 2, 3, 4]
BF16 = dict(rtol=2e-2, atol=2e-2)   # the same bf16 ops may sum in another order on pieces


def _ops():
    """(name, fn(x, w), x shape, w shape, x's split dim): x is split, w replicated or plain."""
    return [
        ("linear", lambda x, w: F.linear(x, w), (5, 6), (4, 6), 0),            # lower precision
        ("mm", lambda x, w: x @ w.t(), (7, 6), (4, 6), 0),
        ("matmul 3-d", lambda x, w: torch.matmul(x, w.t()), (3, 5, 6), (4, 6), 1),
        ("addmm", lambda x, w: torch.addmm(w[:, :1].t().expand(7, 4), x, w.t()), (7, 6), (4, 6), 0),
        ("bmm", lambda x, w: torch.bmm(x, w.t().expand(x.shape[0], 6, 4)), (5, 3, 6), (4, 6), 0),
        ("conv1d", lambda x, w: F.conv1d(x, w.view(4, 2, 3)), (5, 2, 9), (4, 6), 0),
        ("layer_norm", lambda x, w: F.layer_norm(x @ w.t(), (4,)), (7, 6), (4, 6), 0),
        ("softmax", lambda x, w: torch.softmax(x @ w.t(), -1), (7, 6), (4, 6), 0),
        ("log_softmax", lambda x, w: F.log_softmax(x @ w.t(), -1), (7, 6), (4, 6), 0),
        ("mse_loss", lambda x, w: F.mse_loss(x @ w.t(), torch.ones(7, 4)), (7, 6), (4, 6), 0),
        ("cat (promote)", lambda x, w: torch.cat([x @ w.t(), x[:, :4]], 0), (7, 6), (4, 6), 1),
        ("add (no list)", lambda x, w: (x @ w.t()) + x[:, :4], (7, 6), (4, 6), 0),
        ("sum", lambda x, w: (x @ w.t()).sum(0), (7, 6), (4, 6), 0),
    ]


def ops_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.Generator().manual_seed(3)
    for name, fn, xs, ws, dim in _ops():
        x, w = torch.randn(xs, generator=g), torch.randn(ws, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = fn(x, w)
        for wplace in ("replicate", "plain"):
            sx = st.distribute_tensor(x, mesh, [st.Shard(dim)])
            sw = st.distribute_tensor(w, mesh, [st.Replicate()]) if wplace == "replicate" else w
            with torch.autocast("cpu", dtype=torch.bfloat16):
                actual = fn(sx, sw)
            what = f"{name}, weight {wplace}"
            assert actual.dtype == expected.dtype, f"{what}: {actual.dtype} under autocast, one process {expected.dtype}"
            assert_close(actual.full_tensor().float(), expected.float(), what, **BF16)

    # autocast(enabled=False) inside, and a nested region of another dtype.
    x, w = torch.randn(7, 6, generator=g), torch.randn(4, 6, generator=g)
    sx, sw = st.distribute_tensor(x, mesh, [st.Shard(0)]), st.distribute_tensor(w, mesh, [st.Replicate()])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            off = sx @ sw.t()
        on = sx @ sw.t()
        with torch.autocast("cpu", dtype=torch.float16):
            half = sx @ sw.t()
    assert off.dtype == torch.float32 and on.dtype == torch.bfloat16 and half.dtype == torch.float16
    assert_close(off.full_tensor(), x @ w.t(), "autocast(enabled=False)")
    with torch.autocast("cpu", dtype=torch.float16):
        assert_close(half.full_tensor(), x @ w.t(), "nested float16 region", rtol=1e-2, atol=1e-2)
    after = sx @ sw.t()
    assert after.dtype == torch.float32, "autocast must end with its region"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_operators_under_autocast_take_autocasts_dtypes(world_size):
    run_ranks(ops_body, world_size)


def mlp_body(rank, world_size):
    import shardtensor as st
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    single = MLP()
    model = parallelize_module(copy.deepcopy(single), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    x = torch.randn(9, 16, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = single(x)
        actual = model(x)
    assert actual.dtype == expected.dtype == torch.bfloat16, (actual.dtype, expected.dtype)
    got = actual.full_tensor() if isinstance(actual, st.ShardTensor) else actual
    assert_close(got.float(), expected.float(), "MLP output under autocast", **BF16)
    expected.float().square().sum().backward()
    actual.float().square().sum().backward()
    for (name, p), (_, q) in zip(single.named_parameters(), model.named_parameters()):
        assert q.grad.dtype == torch.float32, f"{name}: gradient {q.grad.dtype}, the parameter is fp32"
        got = q.grad.full_tensor() if isinstance(q.grad, st.ShardTensor) else q.grad
        assert_close(got, p.grad, f"{name} gradient under autocast", rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_tensor_parallel_mlp_under_autocast_is_one_processs(world_size):
    run_ranks(mlp_body, world_size)
