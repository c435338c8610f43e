"""The CUDA path from Python: a "cuda" mesh over NCCL, local pieces on cuda:LOCAL_RANK, ops and
redistributes against the single-device result. Skips, saying why, where no GPU is visible."""

import pytest
import torch

from oracle import assert_close, local_of
from ranks import run_ranks

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


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


@pytest.mark.skipif(GPUS == 0, reason="no CUDA device visible (torch.cuda.is_available() is false)")
@pytest.mark.parametrize("world_size", [1, 2])
def test_cuda_mesh(world_size):
    if world_size > GPUS:
        pytest.skip(f"{world_size} ranks need {world_size} GPUs, {GPUS} visible")
    run_ranks(cuda_body, world_size)
