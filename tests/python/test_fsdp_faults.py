"""Issue 75, faults: a rank that dies or stops inside a fully sharded step (in the forward's
all-gather of a parameter, or in the backward's reduce-scatter of a gradient): every other rank
raises within the collective timeout, and none changes its parameters (no optimizer step on a
half-reduced gradient). 2x2 ("dp", "tp") mesh, FSDP x TP; the last rank fails. Under
torch.compile too, where the gathers and reduce-scatters are operators of the graphs."""

import time

import pytest

import torch

from peer_faults import FAULT_ENV, assert_survivors_raised_and_kept_their_parameters, fail, report_and_leave
from ranks import run_ranks
from test_fsdp import MLP, _batches


def _step_armed_and_report(rank, out_dir, fault, model, forward, x, arm):
    """The protocol of these tests: one healthy step (over on every rank before the fault, as in
    test_compile_traced.py), then `arm()` and the step again; each rank reports how long it took,
    whether its parameters kept their values, and what it raised."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    forward(x).pow(2).mean().backward()
    opt.step()
    torch.distributed.barrier()
    before = [p.detach().full_tensor().clone() for p in model.parameters()]
    torch.distributed.barrier()

    arm()
    started = time.monotonic()
    outcome = "no error"
    try:
        opt.zero_grad()
        forward(x).pow(2).mean().backward()
        torch.distributed.barrier()  # a survivor whose own moves completed learns of the fault here
        opt.step()
    except Exception as error:  # noqa: BLE001 - the kind is torch's, shardtensor's or a graph operator's
        outcome = f"raised {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    took = time.monotonic() - started
    unchanged = all(torch.equal(p.detach()._local_tensor, _local_of(p, b)) for p, b in zip(model.parameters(), before))
    report_and_leave(out_dir, rank, fault, f"{took:.1f}", int(unchanged), outcome)


def fails_in_step_body(rank, world_size, out_dir, fault, where):
    import shardtensor as st
    from shardtensor.fsdp import _param, fully_shard
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize_module(MLP(27), mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    fully_shard(model.w1, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    dying, armed = world_size - 1, [False]
    method = "gather" if where == "forward" else "reduce"
    real = getattr(_param.FSDPParam, method)

    def failing(self, *args):  # the last rank fails as it reaches its first move of the armed step
        if armed[0] and rank == dying:
            fail(out_dir, fault)
        return real(self, *args)

    setattr(_param.FSDPParam, method, failing)  # in this rank's process only
    x = _batches(2)[0][mesh.get_coordinate()[0]]
    _step_armed_and_report(rank, out_dir, fault, model, model, x, lambda: armed.__setitem__(0, True))


def _local_of(p, whole):
    """This rank's piece of `whole` as `p` lays it out (its global offsets and local shape)."""
    from shardtensor import _C

    out = whole
    for dim, (offset, size) in enumerate(zip(_C.local_offsets(p), _C.local_shape(p))):
        out = out.narrow(dim, offset, size)
    return out


@pytest.mark.parametrize("fault, where", [("dies", "backward"), ("stops", "forward")])
def test_rank_failing_in_a_fully_sharded_step(fault, where, tmp_path):
    run_ranks(fails_in_step_body, 4, str(tmp_path), fault, where, timeout=120, env=FAULT_ENV)
    assert_survivors_raised_and_kept_their_parameters(tmp_path, 4, fault)


def fails_before_compiled_step_body(rank, world_size, out_dir, fault):
    """The compiled step (fullgraph: the parameters' gathers are in its forward graph, the
    gradients' reduce-scatters in its backward graph): the last rank dies or stops before its
    step, so the others meet it missing inside the forward graph's first gather."""
    import shardtensor as st
    from shardtensor.fsdp import fully_shard
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize_module(MLP(27), mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    fully_shard(model.w1, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # the healthy step compiles it
    x = _batches(2)[0][mesh.get_coordinate()[0]]

    def arm():
        if rank == world_size - 1:
            fail(out_dir, fault)

    _step_armed_and_report(rank, out_dir, fault, model, compiled, x, arm)


@pytest.mark.parametrize("fault", ["dies", "stops"])
def test_rank_failing_before_a_compiled_fully_sharded_step(fault, tmp_path):
    run_ranks(fails_before_compiled_step_body, 4, str(tmp_path), fault, timeout=180, env=FAULT_ENV)
    assert_survivors_raised_and_kept_their_parameters(tmp_path, 4, fault)


def fails_in_prefetch_body(rank, world_size, out_dir, fault):
    """Prefetch configured (test_fsdp_prefetch.with_prefetch): the last rank dies or stops on its
    prefetch stream, inside the first gather that stream runs in the armed step, while its main
    thread computes; the others meet it missing on the stream's own process groups and raise
    where the main thread takes that gather."""
    import shardtensor as st
    from shardtensor.fsdp import _prefetch
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from test_fsdp import _wrap
    from test_fsdp_prefetch import with_prefetch

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize_module(MLP(27), mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    with_prefetch(_wrap(model, mesh["dp"]))
    armed = [False]
    real = _prefetch.STREAM.submit

    def failing_submit(fn):  # in this rank's process only
        def gather():
            if armed[0]:
                fail(out_dir, fault)
            return fn()
        return real(gather if rank == world_size - 1 else fn)

    _prefetch.STREAM.submit = failing_submit
    x = _batches(2)[0][mesh.get_coordinate()[0]]
    _step_armed_and_report(rank, out_dir, fault, model, model, x, lambda: armed.__setitem__(0, True))


@pytest.mark.parametrize("fault", ["dies", "stops"])
def test_rank_failing_in_a_prefetched_gather(fault, tmp_path):
    run_ranks(fails_in_prefetch_body, 4, str(tmp_path), fault, timeout=120, env=FAULT_ENV)
    assert_survivors_raised_and_kept_their_parameters(tmp_path, 4, fault)
