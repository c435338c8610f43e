"""After a collective fails, every mesh over its process group raises at once, a new one made
over the same torch group included (a 1-d init_device_mesh uses the world group each time),
and a mesh over new groups computes again, with the one-process values, although the kernels
lowered for the broken mesh are cached for an equal mesh."""

import os
import time

import pytest

import torch
import torch.nn.functional as F

from ranks import run_ranks


def new_mesh_after_failure_body(rank, world_size):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh

    import shardtensor as st

    torch.manual_seed(0)
    image, weight = torch.randn(1, 1, 9, 6), torch.randn(1, 1, 3, 3)
    expected = F.conv2d(image, weight, padding=1)
    # Off peer memory, the failure reaches the Gloo group itself (on, it only turns peer memory
    # off for the group).
    with st.transport_options(peer_memory=False):
        broken = st.init_device_mesh("cpu", (world_size,))
        x = st.distribute_tensor(image, broken, [st.Shard(2)])
        F.conv2d(x, weight, padding=1)  # the conv's halo is lowered and cached for this mesh
        with pytest.raises(RuntimeError):  # the ranks ask for different layouts
            x.redistribute(broken, [st.Replicate()] if rank == 0 else [st.Shard(3)])
        with pytest.raises(RuntimeError, match="unusable"):
            F.conv2d(x, weight, padding=1)

        again = st.init_device_mesh("cpu", (world_size,))  # over the same world group
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="unusable"):
            st.distribute_tensor(image, again, [st.Shard(2)]).full_tensor()
        took = time.monotonic() - started
        assert took < 5, f"a mesh over the broken world group took {took:.1f} s to raise (timeout 20 s)"

        fresh = TorchDeviceMesh.from_group(dist.new_group(ranks=list(range(world_size))), "cpu")
        y = st.distribute_tensor(image, fresh, [st.Shard(2)])
        torch.testing.assert_close(F.conv2d(y, weight, padding=1).full_tensor(), expected)
    os._exit(0)  # the world group is broken: leave without the exit handlers' collectives


def test_new_mesh_after_a_failed_collective():
    run_ranks(new_mesh_after_failure_body, 2, timeout=120)
