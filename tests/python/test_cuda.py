"""The CUDA path from Python: a "cuda" mesh over NCCL, local pieces on cuda:LOCAL_RANK, ops and
redistributes against the single-device result. Skips, saying why, where no GPU is visible."""

import pytest
import torch

from oracle import assert_close, local_of
from ranks import run_ranks

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no CUDA device visible (torch.cuda.is_available() is false)")


def run_ranks_on_gpus(body, world_size, *args):
    """run_ranks with one GPU a rank: skips, saying so, where fewer than world_size are visible."""
    if world_size > GPUS:
        pytest.skip(f"{world_size} ranks need {world_size} GPUs, {GPUS} visible")
    run_ranks(body, world_size, *args)


def cuda_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cuda", (world_size,))
    device = torch.device("cuda", rank % torch.cuda.device_count())
    g = torch.arange(7 * 5, dtype=torch.float32, device=device).reshape(7, 5)
    x = st.distribute_tensor(g, mesh, [st.Shard(0)])
    assert x.device == device and x.to_local().device == device
    assert_close(x.to_local(), local_of(g, [rank], [world_size], [st.Shard(0)]), "distribute on cuda")
    for target in ([st.Shard(1)], [st.Replicate()]):
        assert_close(x.redistribute(mesh, target).to_local(), local_of(g, [rank], [world_size], target), f"to {target}")
    y = (x * 2).relu().sum(0)
    assert_close(y.full_tensor(), (g * 2).relu().sum(0), "ops on cuda")
    w = torch.nn.Parameter(st.distribute_tensor(torch.ones(5, 3, device=device), mesh, [st.Replicate()]))
    (x @ w).sum().backward()
    assert_close(w.grad.full_tensor(), g.sum(0, keepdim=True).t().expand(5, 3), "gradient on cuda")


@pytest.mark.parametrize("world_size", [1, 2])
def test_cuda_mesh(world_size):
    run_ranks_on_gpus(cuda_body, world_size)


def cuda_attention_body(rank, world_size):
    """F.scaled_dot_product_attention on sequence shards of CUDA tensors: torch picks flash (bf16)
    or memory-efficient attention (float32) for the pieces, and the ring must give what the same
    call gives on the whole tensors on this GPU, values and the three gradients, with no
    all-gather of K or V."""
    import torch.nn.functional as F

    import shardtensor as st

    mesh = st.init_device_mesh("cuda", (world_size,))
    device = torch.device("cuda", rank % torch.cuda.device_count())
    for dtype, tolerance in ((torch.float32, 2e-4), (torch.bfloat16, 3e-2)):
        for is_causal in (False, True):
            what = f"{dtype}, causal={is_causal}"
            torch.manual_seed(7)
            q, k, v, grad = (torch.randn(2, 4, 4 * world_size + 3, 64, device=device, dtype=dtype) for _ in range(4))
            whole = [t.clone().requires_grad_() for t in (q, k, v)]
            expected = F.scaled_dot_product_attention(*whole, is_causal=is_causal)
            (expected * grad).sum().backward()

            sharded = [st.distribute_tensor(t, mesh, [st.Shard(2)]).requires_grad_() for t in (q, k, v)]
            with st.CommDebugMode() as comms:
                out = F.scaled_dot_product_attention(*sharded, is_causal=is_causal)
                (out * st.distribute_tensor(grad, mesh, [st.Shard(2)])).sum().backward()
            assert comms.get_comm_counts().get("all_gather", 0) == 0, f"{what}: {comms.table()}"
            close = dict(rtol=tolerance, atol=tolerance)
            assert_close(out.full_tensor().float(), expected.detach().float(), f"{what}: output", **close)
            for name, s, w in zip("qkv", sharded, whole):
                assert_close(s.grad.full_tensor().float(), w.grad.float(), f"{what}: {name} gradient", **close)


@pytest.mark.parametrize("world_size", [1, 2])
def test_cuda_attention_on_sequence_shards(world_size):
    run_ranks_on_gpus(cuda_attention_body, world_size)


def cuda_batch_norm_body(rank, world_size):
    """BatchNorm2d on an H split of CUDA pieces: libtorch takes cuDNN's batch norm for CUDA
    tensors, which has no sharding rule; shardtensor must run its own (statistics summed across
    the ranks, nothing gathered), in strict mode, values and gradients as on one GPU."""
    import shardtensor as st

    mesh = st.init_device_mesh("cuda", (world_size,))
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.manual_seed(3)
    x, grad = (torch.randn(2, 3, 4 * world_size + 1, 5, device=device) for _ in range(2))
    single = torch.nn.BatchNorm2d(3).to(device)
    whole = x.clone().requires_grad_()
    expected = single(whole)
    (expected * grad).sum().backward()

    sharded_norm = st.distribute_module(torch.nn.BatchNorm2d(3).to(device), mesh)  # parameters and statistics replicated
    piece = st.distribute_tensor(x, mesh, [st.Shard(2)]).requires_grad_()
    with st.strict(), st.CommDebugMode() as comms:
        out = sharded_norm(piece)
        (out * st.distribute_tensor(grad, mesh, [st.Shard(2)])).sum().backward()
    assert comms.get_comm_counts().get("all_gather", 0) == 0, comms.table()
    assert_close(out.full_tensor(), expected.detach(), "batch norm output", rtol=1e-4, atol=1e-5)
    assert_close(piece.grad.full_tensor(), whole.grad, "input gradient", rtol=1e-4, atol=1e-5)
    for name, p in sharded_norm.named_parameters():
        assert_close(p.grad.full_tensor(), getattr(single, name).grad, f"{name} gradient", rtol=1e-4, atol=1e-5)
    for name in ("running_mean", "running_var"):
        assert_close(getattr(sharded_norm, name).full_tensor(), getattr(single, name), name, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("world_size", [1, 2])
def test_cuda_batch_norm_on_spatial_shards(world_size):
    run_ranks_on_gpus(cuda_batch_norm_body, world_size)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_training_step_with_fsdp_tp_autocast_gradscaler_and_fused_adamw(dtype):
    """Issues 75 and 76 on CUDA: the training script's step (test_fsdp.py) at world size 1: a
    ("dp", "tp") mesh of one GPU, tensor parallelism, shardtensor's fully_shard, CUDA autocast,
    GradScaler and fused AdamW (CUDA's fused kernels on the pieces), against eager one-GPU."""
    from test_fsdp import training_script_body

    run_ranks_on_gpus(training_script_body, 1, "cuda", dtype, 5)
