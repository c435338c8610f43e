"""shardtensor inside torch.distributed programs: an existing process group, torch's DTensor
as a second oracle and as a conversion target, and the two launchers."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from oracle import assert_close
from ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4]


def existing_group_body(rank, world_size):
    import datetime

    import torch.distributed as dist

    # The usual torchrun script: the program initialises torch.distributed itself.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    store_before = dist.distributed_c10d._get_default_store()
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    assert dist.distributed_c10d._get_default_store() is store_before, "a second rendezvous was opened"
    assert mesh.get_group() is not None
    x = st.distribute_tensor(torch.arange(6.0), mesh, [st.Shard(0)])
    assert_close(x.full_tensor(), torch.arange(6.0), "over the program's process group")
    # The program's own collectives still work beside shardtensor's.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size


@pytest.mark.parametrize("world_size", [1, 3])
def test_existing_process_group_is_reused(world_size):
    run_ranks(existing_group_body, world_size)


def dtensor_body(rank, world_size):
    import shardtensor as st
    from torch.distributed.tensor import DTensor, Partial as TPartial, Replicate as TReplicate, Shard as TShard

    mesh = st.init_device_mesh("cpu", (world_size,))
    tmesh = mesh.to_torch()
    torch.manual_seed(3)
    a, w = torch.randn(10, 6), torch.randn(6, 5)
    # The same program on DTensor and on shardtensor gives the same values (chunk-uneven rows).
    programs = {
        "mm, relu, sum": lambda x, w: (x @ w).relu().sum(0),
        "softmax, mean": lambda x, w: (x @ w).softmax(-1).mean(),
        "transpose, add": lambda x, w: (x.t() + 1.0) * 2.0,
    }
    for name, program in programs.items():
        ours = program(st.distribute_tensor(a, mesh, [st.Shard(0)]), st.distribute_tensor(w, mesh, [st.Replicate()]))
        theirs = program(DTensor.from_local(a.chunk(world_size)[rank] if rank < len(a.chunk(world_size)) else a[:0],
                                            tmesh, [TShard(0)], shape=a.shape, stride=a.stride()),
                         DTensor.from_local(w, tmesh, [TReplicate()]))
        expected = program(a, w)
        assert_close(ours.full_tensor(), expected, f"{name}: shardtensor vs one process")
        assert_close(theirs.full_tensor(), expected, f"{name}: DTensor vs one process")
    # Conversions share the local tensor, both ways, and keep the layout.
    x = st.distribute_tensor(a, mesh, [st.Shard(0)])
    d = st.to_dtensor(x)
    assert isinstance(d, DTensor) and d.placements == (TShard(0),) and d.shape == x.shape
    assert d.to_local().data_ptr() == x.to_local().data_ptr(), "to_dtensor copied"
    assert_close(d.full_tensor(), a, "to_dtensor values")
    back = st.from_dtensor(d)
    assert back.placements == (st.Shard(0),) and back.to_local().data_ptr() == x.to_local().data_ptr()
    assert_close(back.full_tensor(), a, "from_dtensor values")
    p = st.from_dtensor(DTensor.from_local(torch.full((2,), float(rank)), tmesh, [TPartial("sum")]))
    assert p.placements == (st.Partial("sum"),)
    assert_close(p.full_tensor(), torch.full((2,), float(sum(range(world_size)))), "Partial from DTensor")
    # Explicit sizes that DTensor cannot express are refused with the reason.
    if world_size > 1:
        sizes = [0] * world_size
        sizes[-1] = 10
        y = x.redistribute(mesh, [st.Shard(0)], sharding_shapes={0: sizes})
        with pytest.raises(ValueError, match="chunk"):
            st.to_dtensor(y)
    with pytest.raises(TypeError, match="DTensor"):
        st.from_dtensor(a)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_dtensor_second_oracle_and_conversions(world_size):
    run_ranks(dtensor_body, world_size)


# Each rank reports into its own file: the launchers share one stdout between
# ranks, so printed lines from two ranks can interleave mid-line.
SCRIPT = textwrap.dedent("""
    import os, sys, torch, shardtensor as st
    mesh = st.init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    x = st.distribute_tensor(torch.arange(10.0), mesh, [st.Shard(0)])
    total = (x * 2).sum().full_tensor().item()
    assert total == 90.0, total
    with open(os.path.join(os.path.dirname(sys.argv[0]), f"rank{mesh.get_rank()}.ok"), "w") as f:
        f.write(str(total))
""")


def _launch(cmd, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, SHARDTENSOR_TIMEOUT_S="20", OMP_NUM_THREADS="1")
    return subprocess.run(cmd + [str(script)], env=env, capture_output=True, text=True, timeout=120)


def _ranks_reporting_ok(tmp_path):
    return sorted(int(p.stem[len("rank"):]) for p in tmp_path.glob("rank*.ok") if p.read_text() == "90.0")


def test_shardrun_launches_python_ranks(tmp_path):
    shardrun = os.path.join(os.path.dirname(sys.executable), "shardrun")
    result = _launch([shardrun, "-n", "3", sys.executable], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _ranks_reporting_ok(tmp_path) == [0, 1, 2], result.stdout + result.stderr


def test_torchrun_launches_python_ranks(tmp_path):
    result = _launch([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _ranks_reporting_ok(tmp_path) == [0, 1], result.stdout + result.stderr
