"""The public functions of shardtensor at world sizes 1-4, against the single-process oracle."""

import io
import pickle

import pytest
import torch

from oracle import assert_close, chunk_sizes, local_of
from ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4]


def _mesh_2d_shape(world_size):
    return (2, world_size // 2) if world_size % 2 == 0 and world_size > 2 else (world_size, 1)


# ---- meshes and placements ------------------------------------------------------------------

def mesh_body(rank, world_size):
    import torch.distributed as dist

    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
    assert mesh.size() == world_size and mesh.size(0) == world_size and mesh.size("dp") == world_size
    assert mesh.get_coordinate() == [rank] and mesh.get_local_rank() == rank and mesh.get_rank() == rank
    assert mesh.mesh_dim_names == ("dp",) and mesh.ndim == 1 and mesh.shape == (world_size,)
    assert mesh.mesh.tolist() == list(range(world_size))
    assert dist.get_world_size(mesh.get_group()) == world_size
    assert "DeviceMesh('cpu'" in repr(mesh)
    # A second mesh over the same rendezvous: 2-d, named dims, sub-meshes.
    shape = _mesh_2d_shape(world_size)
    mesh2 = st.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    assert mesh2.get_coordinate() == [rank // shape[1], rank % shape[1]]
    tp = mesh2["tp"]
    assert tp.size() == shape[1] and tp.get_coordinate() == [rank % shape[1]]
    assert dist.get_world_size(mesh2.get_group("tp")) == shape[1]
    assert mesh2["dp"] == mesh2["dp"] and mesh2 != mesh
    with pytest.raises(ValueError, match="holds"):
        st.init_device_mesh("cpu", (world_size + 1,))
    with pytest.raises(ValueError, match="mesh_dim_names"):
        st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("a", "b"))
    with pytest.raises(Exception, match="nope"):
        mesh2["nope"]
    with pytest.raises(ValueError, match="device_type"):
        st._mesh._ensure_process_group("tpu") if not dist.is_initialized() else (_ for _ in ()).throw(
            ValueError("device_type checked before init"))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_mesh(world_size):
    run_ranks(mesh_body, world_size)


def test_import_registers_the_kernels_before_any_tensor():
    """Registration writes the dispatcher's tables, which must not happen while another thread
    dispatches; so it is done by the import (GIL held), not by the first ShardTensor."""
    import subprocess
    import sys

    code = ("import torch\n"
            "assert not torch._C._dispatch_has_kernel_for_dispatch_key('aten::add.Tensor', 'PrivateUse1')\n"
            "import shardtensor\n"
            "assert torch._C._dispatch_has_kernel_for_dispatch_key('aten::add.Tensor', 'PrivateUse1')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_placements_are_values_and_accept_dtensors():
    import shardtensor as st
    from shardtensor import _placements
    from torch.distributed.tensor import Partial as TP, Replicate as TR, Shard as TS

    assert st.Shard(1) == st.Shard(1) and st.Shard(1) != st.Shard(0) and st.Replicate() == st.Replicate()
    assert len({st.Shard(0), st.Shard(0), st.Partial("max")}) == 2
    assert repr(st.Partial("avg")) == "Partial(avg)" and st.Shard(2).is_shard(2) and not st.Shard(2).is_shard(1)
    assert _placements.encode([TS(1), TR(), TP("max")]) == _placements.encode([st.Shard(1), st.Replicate(), st.Partial("max")])
    with pytest.raises(ValueError, match="allowed"):
        st.Partial("median")
    with pytest.raises(TypeError, match="int"):
        st.Shard("0")
    with pytest.raises(ValueError, match="one per mesh dim"):
        _placements.encode([st.Shard(0)], mesh_ndim=2)


# ---- building, reading and moving ShardTensors ----------------------------------------------

def layouts_body(rank, world_size):
    import shardtensor as st

    torch.manual_seed(0)
    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.randn(7, 5, dtype=torch.float64)
    # distribute_tensor with chunk sizes, explicit uneven sizes (with an empty shard), and
    # every placement; the local piece is the oracle's slice.
    explicit = [0] * world_size
    explicit[-1] = 7 if world_size == 1 else 3
    explicit[0] += 7 - explicit[-1] if world_size > 1 else 0
    for placements, sizes in [([st.Shard(0)], None), ([st.Shard(1)], None), ([st.Replicate()], None),
                              ([st.Shard(0)], {0: explicit})]:
        x = st.distribute_tensor(g, mesh, placements, sharding_shapes=sizes)
        assert isinstance(x, torch.Tensor) and isinstance(x, st.ShardTensor) and st.is_shard_tensor(x)
        assert x.shape == g.shape and x.dtype == g.dtype and x.placements == tuple(placements)
        assert x.device_mesh is mesh
        assert_close(x.to_local(), local_of(g, [rank], [world_size], placements, sizes), f"{placements} {sizes}")
        assert_close(x.full_tensor(), g, f"full_tensor of {placements}")
        # Every transition, to every target, equals the oracle's slice.
        for target in ([st.Shard(0)], [st.Shard(1)], [st.Replicate()]):
            # A tensor dim sharded as before keeps its sizes; new shards take torch.chunk sizes.
            kept = sizes if target == placements else None
            y = x.redistribute(mesh, target)
            assert y.placements == tuple(target)
            assert_close(y.to_local(), local_of(g, [rank], [world_size], target, kept), f"{placements}->{target}")
    # Redistribute to explicit uneven sizes (PhysicsNeMo), and the sizes are reported back.
    x = st.distribute_tensor(g, mesh, [st.Shard(0)])
    y = x.redistribute(mesh, [st.Shard(0)], sharding_shapes={0: explicit})
    assert y.shard_sizes() == {0: explicit} and y.local_shape == torch.Size([explicit[rank], 5])
    assert_close(y.to_local(), local_of(g, [rank], [world_size], [st.Shard(0)], {0: explicit}), "to explicit sizes")
    # Per-call transports (plan options): the same values whichever moves the bytes, the plan
    # explain shows names it, and a bad name is an error naming the ones allowed.
    for transport, peer_memory, named in [("messages", None, "by messages"), ("collectives", None, "c10d collective"),
                                          ("auto", False, "by messages"), (None, None, "")]:
        y = x.redistribute(mesh, [st.Shard(1)], transport=transport, peer_memory=peer_memory)
        assert_close(y.to_local(), local_of(g, [rank], [world_size], [st.Shard(1)], None), f"transport={transport}")
        plan = st.explain_redistribute(x, [st.Shard(1)], transport=transport, peer_memory=peer_memory)
        assert world_size == 1 or named in plan, plan
    with pytest.raises(RuntimeError, match="'auto'.*'collectives'.*'messages'"):
        x.redistribute(mesh, [st.Shard(1)], transport="nccl")
    # A transport_options block sets what calls without options take (operators' moves too);
    # a call's own keywords still win, and the block ends with its `with`.
    with st.transport_options(transport="collectives"):
        assert world_size == 1 or "c10d collective" in st.explain_redistribute(x, [st.Shard(1)])
        assert world_size == 1 or "by messages" in st.explain_redistribute(x, [st.Shard(1)], transport="messages")
        with st.transport_options(peer_memory=False):  # nested: keeps the outer transport
            assert world_size == 1 or "c10d collective" in st.explain_redistribute(x, [st.Shard(1)])
        y = x.redistribute(mesh, [st.Shard(1)])
        assert_close(y.to_local(), local_of(g, [rank], [world_size], [st.Shard(1)], None), "in a transport_options block")
        assert_close((x * 2).sum(0).full_tensor(), (g * 2).sum(0), "an operator in a transport_options block")
    assert world_size == 1 or "c10d collective" not in st.explain_redistribute(x, [st.Shard(1)])
    with pytest.raises(RuntimeError, match="'auto'.*'collectives'.*'messages'"):
        with st.transport_options(transport="gloo"):
            pass
    # Small messages are a plan option too: many messages per part, the same values.
    with st.transport_options(transport="messages", message_bytes=64):
        y = x.redistribute(mesh, [st.Shard(1)])
        assert_close(y.to_local(), local_of(g, [rank], [world_size], [st.Shard(1)], None), "64-byte messages")
    for bad in ({"message_bytes": 0}, {"peer_copy_bytes": -1}):
        with pytest.raises(RuntimeError, match="is not a (positive )?size"):
            st.transport_options(**bad).__enter__()
    # src_data_rank (DTensor's): the last rank's tensor is the source; None: each rank's own.
    mine = g + 100 * rank
    last = world_size - 1
    assert_close(st.distribute_tensor(mine, mesh, [st.Shard(0)], src_data_rank=last).full_tensor(), g + 100 * last,
                 "src_data_rank=last")
    own = st.distribute_tensor(mine, mesh, [st.Shard(1)], src_data_rank=None)
    assert_close(own.to_local(), local_of(mine, [rank], [world_size], [st.Shard(1)], None), "src_data_rank=None")
    # Partial: each rank holds a term; full_tensor reduces.
    p = st.from_local(torch.full((3,), float(rank + 1)), mesh, [st.Partial("sum")])
    assert_close(p.full_tensor(), torch.full((3,), float(sum(range(1, world_size + 1)))), "Partial(sum)")
    pm = st.from_local(torch.full((3,), float(rank + 1)), mesh, [st.Partial("max")])
    assert_close(pm.redistribute(mesh, [st.Replicate()]).to_local(), torch.full((3,), float(world_size)), "P(max)->R")
    pmin = st.from_local(torch.full((2,), float(rank + 1)), mesh, [st.Partial("min")])
    assert_close(pmin.full_tensor(), torch.full((2,), 1.0), "Partial(min)")
    pavg = st.from_local(torch.full((2,), float(rank)), mesh, [st.Partial("avg")])
    assert_close(pavg.full_tensor(), torch.full((2,), (world_size - 1) / 2), "Partial(avg)")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_distribute_redistribute_full_tensor(world_size):
    run_ranks(layouts_body, world_size)


def shared_arena_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(9 * 96 * 24, dtype=torch.float64).reshape(9, 96, 24)  # pieces of 18 KiB rows: in the arenas
    x = st.distribute_tensor(g, mesh, [st.Shard(0)])
    # The arenas' in-place reads are a transport of their own, which a transport_options block
    # turns off (peer memory then copies by cross-memory attach); the values are one process's.
    assert "by shared arena" in st.explain_redistribute(x, [st.Replicate()])
    assert_close(x.redistribute(mesh, [st.Replicate()]).to_local(), g, "through the shared arenas")
    with st.transport_options(shared_arena=False):
        plan = st.explain_redistribute(x, [st.Replicate()])
        assert "by peer memory" in plan and "shared arena" not in plan, plan
        assert_close(x.redistribute(mesh, [st.Shard(1)]).to_local(),
                     local_of(g, [rank], [world_size], [st.Shard(1)], None), "by cross-memory attach")


def test_shared_arena_is_a_transport_that_transport_options_turns_off():
    run_ranks(shared_arena_body, 3, env={"SHARDTENSOR_ARENA": "1"})


def from_local_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3)
    chunks = chunk_sizes(10, world_size)
    local = local_of(g, [rank], [world_size], [st.Shard(0)])
    # "chunk" with the global shape, "infer", explicit tensor-dim sizes, PhysicsNeMo's
    # per-mesh-dim shapes, and ShardTensor.from_local: all the same tensor.
    for x in (st.from_local(local, mesh, [st.Shard(0)], shape=(10, 3)),
              st.from_local(local, mesh, [st.Shard(0)], sharding_shapes="infer"),
              st.from_local(local, mesh, [st.Shard(0)], sharding_shapes={0: chunks}),
              st.ShardTensor.from_local(local, mesh, [st.Shard(0)],
                                        sharding_shapes={0: [torch.Size([c, 3]) for c in chunks]})):
        assert x.shape == (10, 3)
        assert_close(x.full_tensor(), g, "from_local")
        assert x.to_local().data_ptr() == local.data_ptr(), "from_local copied the local tensor"
    # Uneven pieces that are not chunk-shaped: "infer" finds them, with an empty piece.
    sizes = [0] + [1] * (world_size - 1) if world_size > 1 else [2]
    mine = torch.full((sizes[rank], 2), float(rank))
    x = st.from_local(mine, mesh, [st.Shard(0)], sharding_shapes="infer")
    assert x.shard_sizes() == {0: sizes}
    expected = torch.cat([torch.full((s, 2), float(r)) for r, s in enumerate(sizes)])
    assert_close(x.full_tensor(), expected, "infer with an empty piece")
    # scatter_tensor: only the source holds the tensor.
    src = world_size - 1
    y = st.scatter_tensor(g if rank == src else None, src, mesh, [st.Shard(0)], requires_grad=True)
    assert y.requires_grad and y.is_leaf
    assert_close(y.to_local().detach(), local, "scatter_tensor")
    # Bad input raises the same error class on every rank.
    with pytest.raises(ValueError, match="sharding_shapes"):
        st.from_local(local, mesh, [st.Shard(0)], sharding_shapes="even")
    with pytest.raises(ValueError, match="placements"):
        st.from_local(local, mesh, [st.Shard(0), st.Shard(1)])
    with pytest.raises(TypeError, match="torch.Tensor"):
        st.from_local([1, 2], mesh, [st.Shard(0)])
    with pytest.raises(ValueError, match=r"sizes|sum"):
        st.from_local(local, mesh, [st.Shard(0)], sharding_shapes={0: [1] * world_size}, run_check=True)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_from_local_and_scatter(world_size):
    run_ranks(from_local_body, world_size)


def factories_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    for name, expected in (("zeros", torch.zeros(5, 3)), ("ones", torch.ones(5, 3))):
        x = getattr(st, name)(5, 3, device_mesh=mesh, placements=[st.Shard(0)])
        assert_close(x.to_local(), local_of(expected, [rank], [world_size], [st.Shard(0)]), name)
    f = st.full((4, 2), 2.5, device_mesh=mesh, placements=[st.Shard(1)], dtype=torch.float64)
    assert f.dtype == torch.float64 and f.shape == (4, 2)
    assert_close(f.full_tensor(), torch.full((4, 2), 2.5, dtype=torch.float64), "full")
    # The default dtype follows torch's, and full() follows its fill value, as torch.full does.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert st.zeros(3, device_mesh=mesh, placements=[st.Shard(0)]).dtype == torch.float64
        assert st.randn(3, device_mesh=mesh, placements=[st.Shard(0)]).dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
    assert st.ones(3, device_mesh=mesh, placements=[st.Shard(0)]).dtype == previous
    for value in (3, True, 2.5):
        made = st.full((5,), value, device_mesh=mesh, placements=[st.Shard(0)])
        assert made.dtype == torch.full((5,), value).dtype, f"full with {value!r} made {made.dtype}"
        assert torch.equal(made.full_tensor(), torch.full((5,), value)), f"full with {value!r}"
    e = st.empty((6,), device_mesh=mesh, placements=[st.Shard(0)], requires_grad=True)
    assert e.requires_grad and e.is_leaf and e.shape == (6,)
    # Random factories do not depend on the layout: the same seed gives the same global tensor.
    for name in ("rand", "randn"):
        st.manual_seed(7)
        a = getattr(st, name)(9, 4, device_mesh=mesh, placements=[st.Shard(0)]).full_tensor()
        st.manual_seed(7)
        b = getattr(st, name)(9, 4, device_mesh=mesh, placements=[st.Replicate()])
        assert_close(a, b.to_local(), f"{name} is sharding-invariant")
        c = getattr(st, name)(9, 4, device_mesh=mesh, placements=[st.Shard(1)], seed=11).full_tensor()
        d = getattr(st, name)(9, 4, device_mesh=mesh, placements=[st.Shard(0)], seed=11).full_tensor()
        assert_close(c, d, f"{name} with a seed")
    with pytest.raises(ValueError, match="seed"):
        st.manual_seed(-1)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_factories(world_size):
    run_ranks(factories_body, world_size)


# ---- operators, debug tools and the Python object protocol ----------------------------------

def ops_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(1)
    a, w = torch.randn(9, 6), torch.randn(6, 4)
    x = st.distribute_tensor(a, mesh, [st.Shard(0)])
    r = st.distribute_tensor(w, mesh, [st.Replicate()])
    # Results of ops are ShardTensors with every attribute, and the oracle's values.
    for name, fn in (("add", lambda t: t + t), ("relu", torch.relu), ("mul", lambda t: t * 3.0),
                     ("sum", lambda t: t.sum(0)), ("t", lambda t: t.t()), ("view", lambda t: t.view(9, 3, 2)),
                     ("softmax", lambda t: t.softmax(-1)), ("mean", lambda t: t.mean())):
        y = fn(x)
        assert isinstance(y, st.ShardTensor) and isinstance(y.placements, tuple), name
        assert_close(y.full_tensor(), fn(a), name)
    y = torch.nn.functional.linear(x, r.t())
    assert_close(y.full_tensor(), a @ w, "linear")
    # No collective for local ops; a local op on a cache hit moves nothing.
    with st.CommDebugMode() as comms:
        z = (x * 2.0).relu()
    assert comms.get_total_counts() == 0, comms.table()
    with st.CommDebugMode() as comms:
        full = z.redistribute(mesh, [st.Replicate()])
    assert comms.get_total_counts() == (1 if world_size > 1 else 0), comms.get_comm_counts()
    assert comms.get_total_counts() == sum(comms.get_comm_counts().values())
    if world_size > 1:
        assert "redistribute" in comms.get_comm_counts_by_operator()
    assert_close(full.to_local(), (a * 2).relu(), "redistribute after ops")
    # local_map: the function sees local pieces; the outputs are ShardTensors again.
    doubled = st.local_map(lambda t: t * 2, out_placements=[st.Shard(0)])(x)
    assert isinstance(doubled, st.ShardTensor)
    assert_close(doubled.full_tensor(), a * 2, "local_map")
    # Strict mode names the operator without a rule; the fallback gives the right answer.
    with st.strict(True):
        with pytest.raises(RuntimeError, match="diag_embed"):
            torch.diag_embed(x)
    with st.strict(False):
        c = torch.diag_embed(x)
    assert "aten::diag_embed" in st.fallback_operators()
    assert_close(c.full_tensor(), torch.diag_embed(a), "fallback diag_embed")
    # Plain tensors next to ShardTensors count as Replicate; with the setting off, an error,
    # or Replicate inside implicit_replication.
    assert_close((x + torch.ones(6)).full_tensor(), a + 1, "implicit replication (default)")
    st.set_implicit_replication(False)
    with pytest.raises(RuntimeError, match="plain"):
        x + torch.ones(6)
    with st.implicit_replication():
        assert_close((x + torch.ones(6)).full_tensor(), a + 1, "implicit replication")
    st.set_implicit_replication(True)
    # Debug views need no communication.
    with st.CommDebugMode() as comms:
        text = repr(x)
        table = st.layout_table(x)
        plan = st.explain_redistribute(x, [st.Replicate()])
    assert comms.get_total_counts() == 0
    assert "[9, 6]" in text and "S(0)" in text and "local piece" in text, text
    assert str(world_size - 1) in table and "->" in plan or "R" in plan


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ops_and_debug_tools(world_size):
    run_ranks(ops_body, world_size)


def inference_body(rank, world_size):
    """Under torch.inference_mode() and torch.no_grad(), a model whose parameters were made
    outside runs as plain torch does: views of those parameters (t, view, detach, expand: what
    F.linear on a 3-d input decomposes into) are normal tensors as in plain torch, computed
    results are inference tensors, and the values are the single-process ones. Uneven rows (9)
    leave an empty shard at 4 ranks on the [3, 9, 6] input's dim 1 split."""
    import torch.nn.functional as F

    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(3)
    a, w1, b1, w2 = torch.randn(3, 9, 6), torch.randn(16, 6), torch.randn(16), torch.randn(6, 16)
    x = st.distribute_tensor(a, mesh, [st.Shard(1)])
    p1 = torch.nn.Parameter(st.distribute_tensor(w1, mesh, [st.Shard(0)]))
    q1 = torch.nn.Parameter(st.distribute_tensor(b1, mesh, [st.Shard(0)]))
    p2 = torch.nn.Parameter(st.distribute_tensor(w2, mesh, [st.Shard(1)]))
    plain_p1 = torch.nn.Parameter(w1.clone())  # made outside the modes, as p1

    def model(inp, first, bias, second):
        return F.linear(F.gelu(F.linear(inp, first, bias)), second)

    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            y = model(x, p1, q1, p2)
            expected = model(a, w1, b1, w2)
            assert not y.requires_grad
            assert_close(y.full_tensor(), expected, f"{mode.__name__}: MLP on a [3, 9, 6] input")
            for name, fn in (("t", lambda t: t.t()), ("view", lambda t: t.view(-1)), ("detach", lambda t: t.detach()),
                             ("expand", lambda t: t.unsqueeze(0).expand(2, -1, -1)), ("relu", torch.relu)):
                ours, plain = fn(p1), fn(plain_p1)
                assert ours.is_inference() == plain.is_inference(), (mode.__name__, name, ours.is_inference())
                assert_close(ours.full_tensor(), fn(w1), f"{mode.__name__}: {name} of a parameter")
            r = y.redistribute(mesh, [st.Replicate()])
            assert_close(r.to_local(), expected, f"{mode.__name__}: redistribute")
    # Outside again: the parameters still train.
    model(x, p1, q1, p2).sum().backward()
    assert p1.grad is not None and p2.grad is not None


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_inference_mode_and_no_grad_match_plain_torch(world_size):
    run_ranks(inference_body, world_size)


def protocol_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    x = st.distribute_tensor(torch.arange(8.0), mesh, [st.Shard(0)])
    for call in (lambda: x.numpy(), lambda: x.tolist(), lambda: pickle.dumps(x),
                 lambda: torch.save(x, io.BytesIO())):
        with pytest.raises(TypeError, match=r"to_local\(\)"):
            call()
    plain = torch.arange(3.0)
    assert plain.tolist() == [0.0, 1.0, 2.0] and plain.numpy().shape == (3,)
    assert pickle.loads(pickle.dumps(plain)).tolist() == [0.0, 1.0, 2.0]
    for attr in ("placements", "device_mesh"):
        assert not hasattr(plain, attr)
    with pytest.raises(TypeError, match="ShardTensor"):
        plain.to_local()
    assert not isinstance(plain, st.ShardTensor)
    import copy

    p = torch.nn.Parameter(x.clone())
    q = copy.deepcopy(p)
    assert isinstance(q, torch.nn.Parameter) and isinstance(q, st.ShardTensor)
    assert_close(q.full_tensor(), torch.arange(8.0), "deepcopy")
    text = st.visualize_sharding(st.distribute_tensor(torch.zeros(4, 4), mesh, [st.Shard(1)]))
    assert "0" in text
    with pytest.raises(TypeError, match="ShardTensor is not constructed"):
        st.ShardTensor()


def sub_mesh_body(rank, world_size):
    """A mesh over all ranks but rank 0 (the whole world at size 1): members match one process,
    rank 0 holds empty pieces of the right global shape, communicates nothing, and raises
    where a value is read."""
    import shardtensor as st

    members = list(range(1, world_size)) or [0]
    mesh = st.DeviceMesh("cpu", members, mesh_dim_names=("sp",))
    inside = rank in members
    assert (mesh.get_coordinate() is not None) == inside and mesh.mesh.tolist() == members
    torch.manual_seed(3)
    a, w = torch.randn(7, 5), torch.randn(5, 3)
    ar, wr = a.clone().requires_grad_(True), w.clone().requires_grad_(True)
    expected = (ar @ wr).softmax(-1).sum(0)
    expected.sum().backward()
    with st.CommDebugMode() as comms:
        x = st.distribute_tensor(ar.detach().clone().requires_grad_(True), mesh, [st.Shard(0)])
        wt = st.distribute_tensor(wr.detach().clone().requires_grad_(True), mesh, [st.Replicate()])
        y = (x @ wt).softmax(-1).sum(0)
        y.sum().backward()
        whole = y.full_tensor()
    assert y.shape == expected.shape and y.placements == (st.Partial(),)
    assert x.grad.placements == (st.Shard(0),) and x.grad.shape == a.shape
    if inside:
        assert_close(whole, expected.detach(), "sub-mesh forward")
        assert_close(x.grad.full_tensor(), ar.grad, "sub-mesh x.grad")
        assert_close(wt.grad.full_tensor(), wr.grad, "sub-mesh w.grad")
        assert abs(y.sum().item() - expected.sum().item()) < 1e-4
    else:
        assert x.to_local().numel() == 0 and y.to_local().numel() == 0 and whole.numel() == 0
        assert comms.get_total_counts() == 0, comms.get_comm_counts()
        with pytest.raises(RuntimeError, match="outside"):
            y.sum().item()
    # The world goes on together afterwards: a collective over every rank.
    world = st.init_device_mesh("cpu", (world_size,))
    total = st.distribute_tensor(torch.ones(world_size, 2), world, [st.Shard(0)]).sum().full_tensor()
    assert total.item() == 2 * world_size
    with pytest.raises(ValueError, match="distinct ranks"):
        st.DeviceMesh("cpu", [0, 0])


@pytest.mark.parametrize("world_size", [1, 3])
def test_mesh_over_a_subset_of_ranks(world_size):
    run_ranks(sub_mesh_body, world_size)


@pytest.mark.parametrize("world_size", [1, 3])
def test_python_object_protocol(world_size):
    run_ranks(protocol_body, world_size)


def bad_input_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(16.0).reshape(4, 4)
    with pytest.raises(ValueError, match=r"Shard\(5\)"):
        st.distribute_tensor(g, mesh, [st.Shard(5)])
    with pytest.raises(TypeError, match="placement"):
        st.distribute_tensor(g, mesh, ["S0"])
    with pytest.raises(ValueError, match=f"src_data_rank={world_size}"):
        st.distribute_tensor(g, mesh, [st.Shard(0)], src_data_rank=world_size)
    with pytest.raises(TypeError, match="src_data_rank"):
        st.distribute_tensor(g, mesh, [st.Shard(0)], src_data_rank="0")
    x = st.distribute_tensor(g, mesh, [st.Shard(0)])
    with pytest.raises(ValueError, match="sizes"):
        x.redistribute(mesh, [st.Shard(0)], sharding_shapes={0: [1] * (world_size + 1)})
    with pytest.raises(ValueError, match="placements"):
        x.redistribute(mesh, [st.Shard(0), st.Replicate()])
    # The mesh still works after every error: no rank was left inside a collective.
    assert_close(x.full_tensor(), g, "after errors")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_bad_input_raises_on_every_rank(world_size):
    run_ranks(bad_input_body, world_size)


def disagreement_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    last = rank == world_size - 1
    # Arguments each rank reads alone differ on one rank: every rank raises, before any byte moves.
    st.manual_seed(100 + rank)
    with pytest.raises(ValueError, match="different seeds"):
        st.rand(4, 3, device_mesh=mesh, placements=[st.Replicate()])
    with pytest.raises(ValueError, match="different seeds"):
        st.manual_seed(200 + rank, mesh)
    with pytest.raises(ValueError, match="different tensors or layouts"):
        st.distribute_tensor(torch.zeros(7 if last else 8, 3), mesh, [st.Shard(0)])
    with pytest.raises(ValueError, match="different layouts"):
        st.from_local(torch.zeros(2 if last else 3, 4), mesh, [st.Shard(0)])
    leaf = torch.ones(4, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):                  # DTensor's type
        st.distribute_tensor(leaf * 2 if last else leaf, mesh, [st.Shard(0)])
    # The mesh still works: no rank was left inside a collective.
    st.manual_seed(3, mesh)
    a = st.rand(4, 3, device_mesh=mesh, placements=[st.Replicate()]).to_local()
    everyone = st.from_local(a.unsqueeze(0), mesh, [st.Shard(0)]).full_tensor()
    for r in range(world_size):
        assert_close(everyone[r], a, f"rank {r}'s replica")


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_that_disagree_raise_on_every_rank(world_size):
    run_ranks(disagreement_body, world_size)


def inplace_shape_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    plain = torch.arange(24.0).reshape(8, 3)
    x = st.distribute_tensor(plain, mesh, [st.Shard(0)])
    # t_, transpose_, unsqueeze_ and squeeze_ change the caller's tensor as plain torch does.
    assert x.t_() is x
    assert x.shape == (3, 8) and x.stride() == plain.t().stride()
    assert x.placements == (st.Shard(1),)
    assert_close(x.full_tensor(), plain.t(), "after t_")
    x.transpose_(0, 1).unsqueeze_(0)
    assert x.shape == (1, 8, 3) and x.placements == (st.Shard(1),)
    x.unsqueeze_(2).squeeze_((0, 2))
    assert x.shape == (8, 3) and x.placements == (st.Shard(0),)
    x.unsqueeze_(-1).squeeze_()
    assert_close(x.full_tensor(), plain, "after transpose_, unsqueeze_ and squeeze_")
    # One that has no rule cannot fall back: a clear error on every rank, the tensor unchanged.
    with st.strict(False):
        with pytest.raises(RuntimeError, match="in place"):
            x.as_strided_((3, 8), (1, 3))
    assert x.shape == (8, 3)
    assert_close(x.full_tensor(), plain, "after a refused as_strided_")


@pytest.mark.parametrize("world_size", [1, 3])
def test_shape_changing_inplace_ops(world_size):
    run_ranks(inplace_shape_body, world_size)
