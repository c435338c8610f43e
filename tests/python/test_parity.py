"""The peers' exact surface: PhysicsNeMo's sharding_shapes / offsets / _spec, the keywords of
ShardTensor.from_local and scatter_tensor, the exception types DTensor raises, scalar arguments
of every Python kind, and the collectives distribute_tensor needs (none where no byte moves).
World sizes 1-4, uneven splits with empty pieces, against one process."""

import pytest
import torch

from oracle import assert_close, chunk_sizes
from ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4]


def _mesh_2d_shape(world_size):
    return (2, world_size // 2) if world_size % 2 == 0 and world_size > 2 else (world_size, 1)


def physicsnemo_readers_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(30.0).reshape(10, 3)
    # Uneven with an empty piece where there is room for one.
    sizes = [0] + chunk_sizes(10, world_size - 1) if world_size > 1 else [10]
    x = st.distribute_tensor(g, mesh, [st.Shard(0)], sharding_shapes={0: sizes})
    assert x.shard_sizes() == {0: sizes}
    shapes = tuple((s, 3) for s in sizes)
    assert x.sharding_shapes() == {0: shapes}                       # by mesh dim, PhysicsNeMo's
    assert x.sharding_shapes(0) == shapes and x._spec.sharding_shapes(0) == shapes
    assert x.offsets() == (sum(sizes[:rank]),) and x.offsets(0) == sum(sizes[:rank])
    spec = x._spec
    assert spec.placements == (st.Shard(0),) and spec.mesh == mesh and spec.local_shape == torch.Size([sizes[rank], 3])
    assert spec.tensor_meta.shape == torch.Size([10, 3]) and spec.tensor_meta.dtype == torch.float32
    # PhysicsNeMo's sharding_shapes feed from_local back: the same layout.
    again = st.ShardTensor.from_local(x.to_local(), mesh, [st.Shard(0)], sharding_shapes=x.sharding_shapes())
    assert again.shard_sizes() == {0: sizes}, again.shard_sizes()
    assert_close(again.full_tensor(), g, "from PhysicsNeMo's sharding_shapes")
    # A replicated tensor has no sharding mesh dim; asking for one names the mesh dims that shard.
    r = st.distribute_tensor(g, mesh, [st.Replicate()])
    assert r.sharding_shapes() == {} and r.offsets() == (0,)
    with pytest.raises(ValueError, match="does not shard"):
        r.sharding_shapes(0)
    with pytest.raises(ValueError, match="mesh_dim=5"):
        x.offsets(5)

    # 2-d mesh, both dims sharding: shapes along each mesh dim, in this rank's row and column.
    shape = _mesh_2d_shape(world_size)
    mesh2 = st.init_device_mesh("cpu", shape)
    g2 = torch.arange(7.0 * 5).reshape(7, 5)
    y = st.distribute_tensor(g2, mesh2, [st.Shard(0), st.Shard(1)])
    rows, cols = chunk_sizes(7, shape[0]), chunk_sizes(5, shape[1])
    i, j = mesh2.get_coordinate()
    assert y.sharding_shapes() == {0: tuple((r_, cols[j]) for r_ in rows), 1: tuple((rows[i], c) for c in cols)}
    assert y.offsets() == (sum(rows[:i]), sum(cols[:j]))
    assert_close(y.to_local(), g2[sum(rows[:i]):sum(rows[:i + 1]), sum(cols[:j]):sum(cols[:j + 1])], "2-d piece")



def constructor_keywords_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(24.0).reshape(6, 4)
    x = st.distribute_tensor(g, mesh, [st.Shard(0)])
    # DTensor's shape= and stride= on the class's from_local too.
    y = st.ShardTensor.from_local(x.to_local(), mesh, [st.Shard(0)], shape=(6, 4), stride=(4, 1))
    assert y.shape == (6, 4) and y.stride() == (4, 1)
    assert_close(y.full_tensor(), g, "from_local with shape and stride")
    with pytest.raises(ValueError, match="stride"):
        st.ShardTensor.from_local(x.to_local(), mesh, [st.Shard(0)], shape=(6, 4), stride=(1, 6))
    # PhysicsNeMo's scatter_tensor(global_shape=, dtype=): one broadcast of the source's header,
    # however many dims, then only each rank's piece.
    source = world_size - 1
    on_src = g if rank == source else None
    with st.CommDebugMode() as comms:
        s = st.scatter_tensor(on_src, source, mesh, [st.Shard(0)], global_shape=(6, 4), dtype=torch.float32)
    if world_size > 1:
        assert comms.get_comm_counts().get("broadcast") == 1, comms.table()   # the header alone, then the scatter
    assert_close(s.full_tensor(), g, "scatter_tensor with global_shape and dtype")
    many = torch.arange(2.0 ** 10).reshape([2] * 10)                 # more dims than the header holds inline
    s10 = st.scatter_tensor(many if rank == source else None, source, mesh, [st.Shard(9)])
    assert_close(s10.full_tensor(), many, "scatter_tensor of a 10-d tensor")
    with pytest.raises(ValueError, match=r"global_shape=\[6, 5\]"):
        st.scatter_tensor(on_src, source, mesh, [st.Shard(0)], global_shape=(6, 5))
    with pytest.raises(ValueError, match="dtype"):
        st.scatter_tensor(on_src, source, mesh, [st.Shard(0)], dtype=torch.float64)
    # The mesh still works after the errors.
    assert_close(st.scatter_tensor(on_src, source, mesh, [st.Replicate()]).full_tensor(), g, "after errors")



def exception_types_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    g = torch.arange(16.0).reshape(4, 4)
    # DTensor's types: ValueError for bad arguments, KeyError for an unknown mesh-dim name,
    # NotImplementedError for what is not supported (another mesh; an op without a rule in
    # strict mode).
    with pytest.raises(ValueError, match=r"Shard\(5\)"):
        st.distribute_tensor(g, mesh, [st.Shard(5)])
    with pytest.raises(ValueError, match="placements"):
        st.distribute_tensor(g, mesh, [st.Shard(0), st.Replicate()])
    with pytest.raises(KeyError, match="'sp'"):
        mesh["sp"]
    with pytest.raises(KeyError, match="'sp'"):
        mesh.size("sp")
    x = st.distribute_tensor(g, mesh, [st.Shard(0)])
    with pytest.raises(ValueError, match="sizes"):
        x.redistribute(mesh, [st.Shard(0)], sharding_shapes={0: [1] * (world_size + 1)})
    if world_size > 1:
        with pytest.raises(ValueError, match="different layouts"):
            st.from_local(torch.zeros(3, 4) if rank == 0 else torch.zeros(3, 5), mesh, [st.Shard(0)], run_check=True)
    other = st.init_device_mesh("cpu", (world_size, 1))
    with pytest.raises(NotImplementedError, match="another mesh"):
        x.redistribute(other, [st.Shard(0), st.Replicate()])
    with st.strict(), pytest.raises(NotImplementedError, match="strict mode"):
        torch.diag_embed(x)                                  # no rule (test_operator_coverage.py's table)
    assert_close(x.full_tensor(), g, "after errors")



def scalar_kinds_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(13.0) % 12
    x = st.distribute_tensor(g, mesh, [st.Shard(0)], sharding_shapes={0: [0] * (world_size - 1) + [13]})
    # Python ints, floats and bools as Scalars: each reaches the rule as what it is.
    for low, high in ((0, 12), (0.0, 12.0), (False, True)):
        got = torch.histc(x, bins=4, min=low, max=high)
        assert_close(got.full_tensor(), torch.histc(g, bins=4, min=low, max=high), f"histc min={low!r} max={high!r}")
    for value in (2, 2.5, True):
        assert_close((x.clamp(0, value) + x.add(value, alpha=2) + x.pow(value)).full_tensor(),
                     g.clamp(0, value) + g.add(value, alpha=2) + g.pow(value), f"pointwise with {value!r}")
        assert_close(torch.linalg.vector_norm(x, ord=value).full_tensor(), torch.linalg.vector_norm(g, ord=value),
                     f"norm of order {value!r}")



def distribute_collectives_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(21.0).reshape(7, 3)
    # src_data_rank=None: nothing moves, nothing is gathered (DTensor makes no collective either).
    with st.CommDebugMode() as comms:
        own = st.distribute_tensor(g + rank, mesh, [st.Shard(0)], src_data_rank=None)
    assert comms.get_total_counts() == 0, comms.table()
    sizes = chunk_sizes(7, world_size)
    assert_close(own.to_local(), (g + rank)[sum(sizes[:rank]):sum(sizes[:rank + 1])], "own piece")
    # A bad argument every rank passes: one small all-gather at most, no text exchange after it.
    with st.CommDebugMode() as comms, pytest.raises(ValueError, match="placements"):
        st.distribute_tensor(g, mesh, [st.Shard(0), st.Replicate(), st.Replicate()])
    assert comms.get_total_counts() <= (1 if world_size > 1 else 0), comms.table()



def noop_redistribute_backward_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(12.0).reshape(4, 3)
    x = st.distribute_tensor(g.clone().requires_grad_(True), mesh, [st.Partial()])
    y = x.redistribute(mesh, [st.Partial()])                           # to the layout it has: a copy
    cotangent = st.distribute_tensor(torch.full((4, 3), 2.0), mesh, [st.Partial()])
    with st.CommDebugMode() as comms:
        y.backward(cotangent)
    # Its backward passes the gradient through: still pending, no collective (the minimum).
    assert comms.get_total_counts() == 0, comms.table()
    assert x.grad.placements == (st.Partial(),)
    assert_close(x.grad.full_tensor(), torch.full((4, 3), 2.0), "gradient of a no-op redistribute")



def layer_norm_row_shards_body(rank, world_size):
    import torch.nn.functional as F

    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    g = torch.randn(2 * world_size + 1, 5, 6, dtype=torch.float64)     # rows split unevenly
    w, b = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    x = st.distribute_tensor(g.clone().requires_grad_(True), mesh, [st.Shard(0)])
    ws = st.distribute_tensor(w.clone().requires_grad_(True), mesh, [st.Replicate()])
    bs = st.distribute_tensor(b.clone().requires_grad_(True), mesh, [st.Replicate()])
    with st.CommDebugMode() as comms:
        y = F.layer_norm(x, (6,), ws, bs)
        (y * y).sum().backward()
    # Every row is whole on its rank: the forward and backward need no collective, and the
    # weight and bias gradients are pending sums over the rows, reduced once when read.
    assert comms.get_total_counts() == 0, comms.table()
    assert ws.grad.placements == (st.Partial(),) and bs.grad.placements == (st.Partial(),)
    gr, wr, br = (t.clone().requires_grad_(True) for t in (g, w, b))
    (F.layer_norm(gr, (6,), wr, br) ** 2).sum().backward()
    with st.CommDebugMode() as comms:
        dw, db = ws.grad.full_tensor(), bs.grad.full_tensor()
    assert comms.get_total_counts() == (2 if world_size > 1 else 0), comms.table()
    assert_close(dw, wr.grad, "weight gradient", rtol=1e-10, atol=1e-12)
    assert_close(db, br.grad, "bias gradient", rtol=1e-10, atol=1e-12)
    sizes = chunk_sizes(2 * world_size + 1, world_size)
    start = sum(sizes[:rank])
    assert_close(x.grad.to_local(), gr.grad[start:start + sizes[rank]], "input gradient", rtol=1e-10, atol=1e-12)



def pending_norm_body(rank, world_size):
    """A norm over a split dim is a pending norm of the local norms (DTensor's _NormPartial): no
    collective until it is read, and the norm of such norms stays pending, so clip_grad_norm_
    over sharded gradients makes one all-reduce in all."""
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(4)
    g = torch.randn(11, 3, dtype=torch.float64)
    sizes = [0] + chunk_sizes(11, world_size - 1) if world_size > 1 else [11]
    x = st.distribute_tensor(g, mesh, [st.Shard(0)], sharding_shapes={0: sizes}).requires_grad_()
    with st.CommDebugMode() as comms:
        n2, n3 = torch.linalg.vector_norm(x), torch.linalg.vector_norm(x, ord=3, dim=0)
        d = torch.dist(x, x * 2, p=2.5)
    assert comms.get_total_counts() == 0, comms.get_comm_counts()
    assert n2.placements == (st.NormPartial(2),) and n3.placements == (st.NormPartial(3),), (n2.placements, n3.placements)
    assert torch.linalg.vector_norm(x, ord=1).placements == (st.Partial("sum"),)
    gx = g.clone().requires_grad_()
    assert_close(n2.full_tensor(), torch.linalg.vector_norm(gx), "2-norm")
    assert_close(n3.full_tensor(), torch.linalg.vector_norm(gx, ord=3, dim=0), "3-norm over the split dim")
    assert_close(d.full_tensor(), torch.dist(gx, gx * 2, p=2.5), "dist")
    (n2 + n3.sum() + d).backward()
    (torch.linalg.vector_norm(gx) + torch.linalg.vector_norm(gx, ord=3, dim=0).sum() + torch.dist(gx, gx * 2, p=2.5)).backward()
    assert_close(x.grad.full_tensor(), gx.grad, "gradients through pending norms", rtol=1e-10, atol=1e-12)

    # clip_grad_norm_ over sharded gradients: the gradients' norms, their norm, one all-reduce.
    model = torch.nn.Sequential(torch.nn.Linear(3, 7, bias=False), torch.nn.Linear(7, 2, bias=False)).double()
    reference = torch.nn.Sequential(torch.nn.Linear(3, 7, bias=False), torch.nn.Linear(7, 2, bias=False)).double()
    reference.load_state_dict(model.state_dict())
    for layer, placement in zip(model, (st.Shard(0), st.Shard(1))):
        layer.weight = torch.nn.Parameter(st.distribute_tensor(layer.weight.detach(), mesh, [placement]))
    inputs = torch.randn(5, 3, dtype=torch.float64)
    with st.implicit_replication():
        model(inputs).square().sum().backward()
    reference(inputs).square().sum().backward()
    with st.CommDebugMode() as comms:
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm=0.5)
    assert comms.get_comm_counts() == ({"all_reduce": 1} if world_size > 1 else {}), comms.get_comm_counts()
    assert_close(total.full_tensor(), expected, "clip_grad_norm_'s total norm")
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert_close(ours.grad.full_tensor(), theirs.grad, "clipped gradient", rtol=1e-10, atol=1e-12)


# One launch per world size runs every body in turn: spawning ranks is most of a multi-rank
# test's time on CI's two cores.
BODIES = (physicsnemo_readers_body, constructor_keywords_body, exception_types_body, scalar_kinds_body,
          distribute_collectives_body, noop_redistribute_backward_body, layer_norm_row_shards_body, pending_norm_body)


def all_bodies(rank, world_size):
    for body in BODIES:
        body(rank, world_size)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_peer_parity(world_size):
    run_ranks(all_bodies, world_size, timeout=600)
