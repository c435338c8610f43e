"""Where DTensor users rely on its behaviour (issue 76, item 7), against one process and with
the collectives counted, at 1-4 ranks with uneven and empty pieces:

- amax / amin / max() / min() over a split dim stay a pending Partial("max") / Partial("min")
  with no collective, also where a piece is empty (it holds the identity);
- an embedding table split on the embedding dim (colwise) is looked up with no collective, the
  output split on its last dim, and its gradient split on the table's columns;
- from_local of a meta tensor on a CPU mesh (deferred initialisation), materialised by to_empty;
- redistribute with no placements raises RuntimeError on every rank, as DTensor does;
- a call that names no mesh means the innermost `with mesh:`, else the mesh built last.
"""

import pytest
import torch

import shardtensor as st
from oracle import assert_close
from ranks import run_ranks


def _extremum_checks(mesh, world_size):
    g = torch.randn(5, 4, dtype=torch.float64)                       # rows 2, 2, 1, 0 at 4 ranks
    x = st.distribute_tensor(g, mesh, [st.Shard(0)])
    for name, f, kind in [("amax(0)", lambda t: t.amax(0), "max"), ("amin(0)", lambda t: t.amin(0), "min"),
                          ("amax((0, 1))", lambda t: t.amax((0, 1)), "max"), ("max()", lambda t: t.max(), "max"),
                          ("min()", lambda t: t.min(), "min"), ("amax(0, keepdim)", lambda t: t.amax(0, keepdim=True), "max")]:
        with st.CommDebugMode() as comms:
            y = f(x)
        assert comms.get_total_counts() == 0, (name, comms.get_comm_counts())
        assert y.placements == (st.Partial(kind),), (name, y.placements)
        assert_close(y.full_tensor(), f(g), name)
    ints = torch.arange(20).reshape(5, 4) - 7
    xi = st.distribute_tensor(ints, mesh, [st.Shard(0)])
    assert torch.equal(xi.amax(0).full_tensor(), ints.amax(0)) and torch.equal(xi.amin(0).full_tensor(), ints.amin(0))
    leaf = st.distribute_tensor(g, mesh, [st.Shard(0)]).requires_grad_()
    reference = g.clone().requires_grad_()
    (leaf.amax(0) * torch.arange(4.0)).sum().backward()
    (reference.amax(0) * torch.arange(4.0)).sum().backward()
    assert_close(leaf.grad.full_tensor(), reference.grad, "amax's gradient")


def _colwise_embedding_checks(mesh):
    torch.manual_seed(0)
    table = torch.randn(10, 5, dtype=torch.float64)                 # columns 2, 2, 1, 0 at 4 ranks
    idx = torch.tensor([[1, 2, 9], [4, 4, 0]])
    w = st.distribute_tensor(table, mesh, [st.Shard(1)]).requires_grad_()
    i = st.distribute_tensor(idx, mesh, [st.Replicate()])
    with st.CommDebugMode() as comms:
        out = torch.nn.functional.embedding(i, w)
    assert comms.get_total_counts() == 0, comms.get_comm_counts()
    assert out.placements == (st.Shard(2),), out.placements
    reference = table.clone().requires_grad_()
    expected = torch.nn.functional.embedding(idx, reference)
    assert_close(out.full_tensor(), expected, "colwise lookup")
    weights = torch.randn(2, 3, 5, dtype=torch.float64)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    assert w.grad.placements == w.placements, w.grad.placements
    assert_close(w.grad.full_tensor(), reference.grad, "colwise lookup's table gradient")


def _deferred_init_checks(mesh, world_size):
    meta = st.from_local(torch.empty(3, 4, device="meta"), mesh, [st.Shard(0)])
    assert meta.shape == (3 * world_size, 4) and meta.to_local().is_meta
    module = torch.nn.Linear(4, 3 * world_size, device="meta")
    module.weight = torch.nn.Parameter(st.from_local(torch.empty(3, 4, device="meta"), mesh, [st.Shard(0)]))
    module.to_empty(device="cpu")
    assert module.weight.to_local().device.type == "cpu" and module.weight.placements == (st.Shard(0),)
    with torch.no_grad():
        module.weight.fill_(2.0)
    assert_close(module.weight.full_tensor(), torch.full((3 * world_size, 4), 2.0), "materialised weight")


def _current_mesh_checks(mesh, world_size):
    """A call that names no mesh means the innermost `with mesh:` (torch's mesh stack, which DTensor
    reads too), else the mesh the program built last; sub-meshes and lookups never change it."""
    grid = st.init_device_mesh("cpu", (world_size, 1), mesh_dim_names=("dp", "tp"))
    tp = grid["tp"]
    st.from_local(torch.ones(1), tp, [st.Replicate()]).device_mesh  # a lookup, not a mesh the program built
    x = torch.arange(6.0).reshape(3, 2)
    assert st.distribute_tensor(x, placements=[st.Shard(0), st.Replicate()]).device_mesh == grid
    with mesh:
        assert st.distribute_tensor(x, placements=[st.Shard(0)]).device_mesh == mesh
        with tp:
            assert st.distribute_tensor(x, placements=[st.Replicate()]).device_mesh == tp
            assert st.parallel.parallelize_module(torch.nn.Linear(2, 2), parallelize_plan=st.parallel.ColwiseParallel()
                                                  ).weight.device_mesh == tp
        torch_dtensor = torch.distributed.tensor.distribute_tensor(x, placements=[torch.distributed.tensor.Shard(0)])
        assert torch_dtensor.device_mesh == mesh, torch_dtensor.device_mesh
        assert st.distribute_tensor(x, placements=[st.Shard(1)]).device_mesh == mesh
    with mesh.to_torch():  # torch's own DeviceMesh
        assert st.distribute_tensor(x, placements=[st.Shard(0)]).device_mesh == mesh
    assert st.distribute_tensor(x, placements=[st.Shard(0), st.Replicate()]).device_mesh == grid


def conventions_body(rank, world_size):
    mesh = st.init_device_mesh("cpu", (world_size,))
    _extremum_checks(mesh, world_size)
    _colwise_embedding_checks(mesh)
    _deferred_init_checks(mesh, world_size)
    _current_mesh_checks(mesh, world_size)
    x = st.distribute_tensor(torch.ones(4, 2), mesh, [st.Shard(0)])
    with pytest.raises(RuntimeError, match="placements is needed"):
        x.redistribute(mesh)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_dtensor_conventions(world_size):
    run_ranks(conventions_body, world_size)
