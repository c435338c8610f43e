"""PhysicsNeMo's sync_module_over_mesh: plain parameters and buffers equal over the mesh, from
one rank's copy; ShardTensor parameters untouched; ranks whose modules differ raise on every
rank before any value moves. World sizes 1-4 and a 2-d mesh's axis."""

import pytest
import torch

from ranks import run_ranks


def _model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 3))
    model[1].running_mean.normal_()          # a buffer that differs too
    return model


def sync_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    src = world_size - 1
    model = _model(seed=rank)               # every rank starts from other values
    expected = _model(seed=src).state_dict()
    sharded = st.distribute_tensor(torch.arange(8.0), mesh, [st.Shard(0)])
    model.register_parameter("sharded", torch.nn.Parameter(sharded))
    with st.CommDebugMode():
        st.sync_module_over_mesh(model, mesh, src_mesh_rank=src, verify=True)
    for name, value in expected.items():
        assert torch.equal(model.state_dict()[name], value), name
    torch.testing.assert_close(model.sharded.full_tensor(), torch.arange(8.0))   # its layout owns its values

    with pytest.raises(ValueError, match="src_mesh_rank=7"):
        st.sync_module_over_mesh(model, mesh, src_mesh_rank=7)
    if world_size > 1:
        # One rank's module has another width: every rank raises, naming it, and nothing moves.
        other = torch.nn.Sequential(torch.nn.Linear(4, 6 if rank == 1 else 5))
        with pytest.raises(RuntimeError, match="differ.*'0.weight'"):   # PhysicsNeMo's type
            st.sync_module_over_mesh(other, mesh)




def axis_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "domain"))
    with pytest.raises(ValueError, match="mesh\\['domain'\\]"):
        st.sync_module_over_mesh(_model(0), mesh)
    model = _model(seed=rank)
    st.sync_module_over_mesh(model, mesh["domain"])       # equal within each domain pair only
    coordinate = mesh.get_coordinate()
    source = 2 * coordinate[0]                           # domain position 0 of this rank's row
    for name, value in _model(seed=source).state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


def all_bodies(rank, world_size):
    sync_body(rank, world_size)
    if world_size == 4:
        axis_body(rank, world_size)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sync_module_over_mesh(world_size):
    run_ranks(all_bodies, world_size)
