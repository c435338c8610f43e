"""A rank that dies or stops inside DDP's backward, in the comm hook of sum_gradients_with_ddp:
every other rank raises within the collective timeout, and none changes its parameters (no
optimizer step on a half-summed gradient). 2x2 ("dp", "domain") mesh; the last rank fails."""

import time

import pytest

import torch
import torch.nn.functional as F

from peer_faults import FAULT_ENV, assert_survivors_raised_and_kept_their_parameters, fail, report_and_leave
from ranks import run_ranks


def fails_in_hook_body(rank, world_size, out_dir, fault):
    import shardtensor as st
    from shardtensor.parallel import ddp as st_ddp

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "domain"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 1, 3, padding=1))
    dying, armed = world_size - 1, [False]
    real_hook = st_ddp._mesh_sum_hook

    def hook(state, bucket):  # the last rank fails when DDP hands it a bucket, before its all-reduce
        if armed[0] and rank == dying:
            fail(out_dir, fault)
        return real_hook(state, bucket)

    st_ddp._mesh_sum_hook = hook  # in this rank's process only, before DDP takes it
    wrapped = torch.nn.parallel.DistributedDataParallel(model, process_group=mesh["dp"].get_group())
    st.parallel.sum_gradients_with_ddp(wrapped, mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = st.distribute_tensor(torch.randn(2, 1, 9, 6), mesh["domain"], [st.Shard(2)])
    target = st.distribute_tensor(torch.randn(2, 1, 9, 6), mesh["domain"], [st.Shard(2)])
    F.mse_loss(wrapped(x), target).backward()  # one healthy step first
    opt.step()
    torch.distributed.barrier()  # over on every rank before the fault (as in test_compile_traced.py)
    before = [p.detach().clone() for p in model.parameters()]

    armed[0] = True
    started = time.monotonic()
    outcome = "no error"
    try:
        opt.zero_grad()
        F.mse_loss(wrapped(x), target).backward()
        torch.distributed.barrier()  # a survivor whose own sum completed learns of the death here
        opt.step()
    except Exception as error:  # noqa: BLE001 - the kind is torch's (RuntimeError or DistBackendError)
        outcome = f"raised {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    took = time.monotonic() - started
    unchanged = all(torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))
    report_and_leave(out_dir, rank, fault, f"{took:.1f}", int(unchanged), outcome)


@pytest.mark.parametrize("fault", ["dies", "stops"])
def test_rank_failing_in_ddp_comm_hook(fault, tmp_path):
    run_ranks(fails_in_hook_body, 4, str(tmp_path), fault, timeout=120, env=FAULT_ENV)
    assert_survivors_raised_and_kept_their_parameters(tmp_path, 4, fault)
