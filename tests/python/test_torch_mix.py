"""Issue 80: PhysicsNeMo's programs mix ShardTensors with torch's DTensor world.

- one placement vocabulary: shardtensor's placements are torch's (equal both ways, equal
  hashes, isinstance), with ZigzagShard and NormPartial equal to no plain Shard / Partial;
- meshes copy (a module holding one deep-copies) and pickle within a process; the sub-meshes
  of one mesh share one torch root (torch joins them; FSDP2's HSDP over the joined mesh);
- PhysicsNeMo's contracts: sync_module_over_mesh skips DTensors and raises RuntimeError for
  modules that differ; handler registries take any OpOverload and replace a handler registered
  twice; ShardTensor.from_local(..., global_shape=...) checks the shape on every rank;
- torch DTensors as operands beside ShardTensors, on the same mesh or a sub-mesh, with their
  gradients as DTensors; on an unrelated mesh, an error naming both.

The multi-rank checks run in one body per world size (1-4), each launch costing seconds.
"""

import copy
import pickle
import re
import weakref

import pytest
import torch
from torch.distributed.tensor import Partial as TPartial
from torch.distributed.tensor import Placement as TPlacement
from torch.distributed.tensor import Replicate as TReplicate
from torch.distributed.tensor import Shard as TShard
from torch.distributed.tensor._ops._math_ops import _NormPartial

import shardtensor as st
from ranks import run_ranks

# (ours, torch's) pairs that must be one placement.
_SAME = [
    (st.Shard(0), TShard(0)), (st.Shard(1), TShard(1)), (st.Shard(-1), TShard(-1)), (st.Replicate(), TReplicate()),
    *[(st.Partial(op), TPartial(op)) for op in ("sum", "avg", "max", "min", "product")],
    (st.Partial(), TPartial()), (st.NormPartial(2), _NormPartial(2)), (st.NormPartial(3.5), _NormPartial(3.5)),
]


@pytest.mark.parametrize("ours,theirs", _SAME, ids=lambda p: repr(p))
def test_placements_are_torchs(ours, theirs):
    assert ours == theirs and theirs == ours
    assert not (ours != theirs) and not (theirs != ours)
    assert hash(ours) == hash(theirs)
    assert isinstance(ours, type(theirs)) and isinstance(ours, TPlacement)
    assert {theirs: "found"}[ours] == "found" and {ours: "found"}[theirs] == "found"
    assert repr(ours) == repr(theirs) or isinstance(ours, st.NormPartial)
    assert (ours.is_shard(), ours.is_replicate(), ours.is_partial()) == (
        theirs.is_shard(), theirs.is_replicate(), theirs.is_partial())


def test_placements_that_differ():
    # Each pair must compare unequal both ways, whichever side's __eq__ / __ne__ Python asks.
    pairs = [(st.Shard(0), TShard(1)), (st.Shard(0), TReplicate()), (st.Partial("sum"), TPartial("max")),
             (st.ZigzagShard(1), TShard(1)), (st.ZigzagShard(1), st.Shard(1)), (st.ZigzagShard(1), st.ZigzagShard(1, 2)),
             (st.NormPartial(2), TPartial("sum")), (st.NormPartial(2), st.Partial("sum")),
             (st.NormPartial(2), _NormPartial(3)), (st.Replicate(), TPartial())]
    for a, b in pairs:
        assert a != b and b != a and not (a == b) and not (b == a), (a, b)
    assert isinstance(st.ZigzagShard(1), TShard) and isinstance(st.NormPartial(2), st.Partial)
    assert st.NormPartial(2).reduce_op == "sum"                   # torch's: a sum of p-th powers
    with pytest.raises(ValueError, match="allowed are"):
        st.Partial("norm")
    with pytest.raises(TypeError, match="must be an int"):
        st.Shard(1.0)


@pytest.mark.parametrize("p", [st.Shard(2), st.Replicate(), st.Partial("max"), st.NormPartial(3),
                               st.ZigzagShard(1), st.ZigzagShard(0, unit=4)], ids=repr)
def test_placements_copy_pickle_and_write_themselves(p):
    for again in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p), copy.copy(p)):
        assert again == p and type(again) is type(p) and hash(again) == hash(p)
    assert pickle.loads(pickle.dumps(p)).__dict__ == p.__dict__       # ZigzagShard's unit too
    text, names = p.__fx_repr__()                                     # how a compiled graph writes it
    assert eval(text, names) == p
    assert weakref.ref(p)() is p                                      # graphs hold placements weakly


def test_decoded_placements_are_torchs():
    # What x.placements returns (the C++ encoding decoded), with torch's objects going in.
    from shardtensor import _placements

    given = [TShard(1), TReplicate(), TPartial("avg"), _NormPartial(2)]
    decoded = _placements.decode(_placements.encode(given))
    assert decoded == tuple(given) and tuple(given) == decoded
    assert [type(p) for p in decoded] == [st.Shard, st.Replicate, st.Partial, st.NormPartial]
    assert [type(p) for p in _placements.to_torch(decoded)] == [TShard, TReplicate, TPartial, _NormPartial]


def _placement_checks(mesh, g):
    # Placements: torch's go in, ours come out, and they are the same.
    x = st.distribute_tensor(g, mesh, [TShard(0)])
    assert x.placements == (TShard(0),) and (TShard(0),) == x.placements
    assert {TShard(0): "rows"}[x.placements[0]] == "rows"
    s = x.sum(0)
    assert s.placements == (TPartial("sum"),) and isinstance(s.placements[0], TPartial)
    torch.testing.assert_close(s.full_tensor(), g.sum(0))


def _mesh_checks(rank, world_size, mesh, blob_path):
    from shardtensor._mesh import DeviceMesh

    assert copy.copy(mesh) is mesh and copy.deepcopy(mesh) is mesh
    model = torch.nn.Linear(3, 2)
    model.mesh = mesh                                       # PhysicsNeMo's modules keep their mesh
    model.weight = torch.nn.Parameter(st.distribute_tensor(model.weight.detach(), mesh, [st.Shard(0)]))
    twin = copy.deepcopy(model)
    assert twin.mesh is mesh and twin.weight.device_mesh == mesh and twin.weight is not model.weight
    torch.testing.assert_close(twin.weight.full_tensor(), model.weight.full_tensor())
    again = pickle.loads(pickle.dumps(mesh))
    assert again == mesh and again.get_group() is mesh.get_group()
    assert pickle.loads(pickle.dumps([mesh, mesh]))[1] is again
    if world_size == 4:
        grid = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "domain"))
        for m in (grid, grid["dp"], grid["domain"]):
            back = pickle.loads(pickle.dumps(m))
            assert isinstance(back, DeviceMesh) and back == m and back.mesh_dim_names == m.mesh_dim_names
            assert back.get_coordinate() == m.get_coordinate()
        assert pickle.loads(pickle.dumps(grid["dp"])) != pickle.loads(pickle.dumps(grid["domain"]))
    if rank == 0 and blob_path is not None:
        with open(blob_path, "wb") as f:
            f.write(pickle.dumps(mesh))                     # unpickled by the test's own process


def _sync_checks(rank, world_size, mesh):
    from torch.distributed.tensor import distribute_tensor as torch_distribute

    src = world_size - 1
    torch.manual_seed(rank)                                 # every rank starts from other values
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    torch.manual_seed(src)
    expected = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).state_dict()
    # A DTensor parameter and buffer hold each rank's own values: sync must leave them as they are.
    mine = torch.full((world_size, 2), float(rank))
    model[1].register_parameter("extra", torch.nn.Parameter(torch_distribute(mine, mesh.to_torch(), [TReplicate()],
                                                                             src_data_rank=None)))
    model[1].register_buffer("stat", torch_distribute(mine, mesh.to_torch(), [TShard(0)], src_data_rank=None))
    st.sync_module_over_mesh(model, mesh, src_mesh_rank=src, verify=True)
    state = model.state_dict()
    for name, value in expected.items():
        assert torch.equal(state[name], value), name
    assert torch.equal(model[1].extra.to_local(), mine) and torch.equal(model[1].stat.to_local(), mine[rank:rank + 1])

    # PhysicsNeMo's types: RuntimeError for the module's state, on every rank, naming the rank.
    everything_sharded = torch.nn.Linear(2, 2)
    everything_sharded.weight = torch.nn.Parameter(st.distribute_tensor(torch.ones(2, 2), mesh, [st.Shard(0)]))
    everything_sharded.bias = torch.nn.Parameter(st.distribute_tensor(torch.ones(2), mesh, [st.Replicate()]))
    with pytest.raises(RuntimeError, match="all distributed"):
        st.sync_module_over_mesh(everything_sharded, mesh)
    odd = world_size - 1                                    # only this rank's module is on the meta device
    with torch.device("meta" if rank == odd else "cpu"):
        lopsided = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match=f"mesh rank {odd}, '.*weight' is a meta tensor"):
        st.sync_module_over_mesh(lopsided, mesh)
    with pytest.raises(ValueError, match="src_mesh_rank"):  # an argument: still ValueError
        st.sync_module_over_mesh(model, mesh, src_mesh_rank=world_size)


def _handler_checks(rank, world_size, mesh, g):
    import torch.nn.functional as F
    from shardtensor import ShardTensor

    x = st.distribute_tensor(g, mesh, [st.Shard(0)])
    saved = (dict(ShardTensor._dispatch_registry), dict(ShardTensor._function_registry))
    try:
        # Any OpOverload is stored, as PhysicsNeMo's dict keeps it; aten.add.default is a
        # TorchScript-only overload (Scalar + Scalar) that torch's dispatcher does not know.
        def never(*args, **kwargs):
            raise AssertionError("a handler of an operator the dispatcher never routes ran")

        ShardTensor.register_dispatch_handler(torch.ops.aten.add.default, never)
        assert ShardTensor._dispatch_registry[torch.ops.aten.add.default] is never
        torch.testing.assert_close((x + x).full_tensor(), g + g)          # aten.add.Tensor: its C++ rule

        # A second handler for an operator replaces the first.
        def zeros(t):
            return ShardTensor.from_local(torch.zeros_like(t.to_local()), t.device_mesh, t.placements,
                                          sharding_shapes=t.sharding_shapes())

        def erf(t):
            return ShardTensor.from_local(torch.special.erf(t.to_local()), t.device_mesh, t.placements,
                                          sharding_shapes=t.sharding_shapes())

        ShardTensor.register_dispatch_handler(torch.ops.aten.erf.default, zeros)
        torch.testing.assert_close(torch.erf(x).full_tensor(), torch.zeros_like(g))
        ShardTensor.register_dispatch_handler(torch.ops.aten.erf.default, erf)
        torch.testing.assert_close(torch.erf(x).full_tensor(), torch.erf(g))

        # The same for functions, torch.mul (a builtin) and F.softsign, by whatever name is current.
        for home, name, expected in ((torch, "mul", g * g), (F, "softsign", F.softsign(g))):
            func = getattr(home, name)
            ShardTensor.register_function_handler(func, lambda f, types, args, kwargs: args[0] * 0)
            current = getattr(home, name)
            assert current is not func                                    # the patched name
            ShardTensor.register_function_handler(current, lambda f, types, args, kwargs: f(*args, **kwargs))
            assert sum(k is func for k in ShardTensor._function_registry) == 1   # one entry, replaced
            result = current(x, x) if name == "mul" else current(x)
            torch.testing.assert_close(result.full_tensor(), expected, msg=name)
    finally:
        ShardTensor._dispatch_registry = saved[0]
        ShardTensor._function_registry = saved[1]
    # Restoring the registries put torch's own functions back.
    assert not hasattr(torch.mul, "_shardtensor_original") and not hasattr(F.softsign, "_shardtensor_original")


def _global_shape_checks(rank, world_size, mesh, g):
    from shardtensor import ShardTensor

    sizes = [10 - 3 * (world_size - 1)] + [3] * (world_size - 1)        # 10 rows, uneven
    start = sum(sizes[:rank])
    piece = g[start:start + sizes[rank]]
    for how in ("infer", {0: [(n, 3) for n in sizes]}):
        y = ShardTensor.from_local(piece, mesh, [st.Shard(0)], how, (10, 3))   # PhysicsNeMo's positions
        torch.testing.assert_close(y.full_tensor(), g)
        with pytest.raises(ValueError, match=r"global shape \(11, 3\) does not match .* shape \(10, 3\)"):
            ShardTensor.from_local(piece, mesh, [st.Shard(0)], how, global_shape=(11, 3))
        if world_size > 1:
            # One rank passes another shape: every rank raises, none hangs or goes on.
            theirs = (11, 3) if rank == 1 else (10, 3)
            with pytest.raises(ValueError, match="does not match" if rank == 1 else "another rank's global shape"):
                ShardTensor.from_local(piece, mesh, [st.Shard(0)], how, global_shape=theirs)
    chunk = st.distribute_tensor(g, mesh, [st.Shard(0)]).to_local()
    y = ShardTensor.from_local(chunk, mesh, [st.Shard(0)], "chunk", global_shape=(10, 3))
    torch.testing.assert_close(y.full_tensor(), g)
    # torch.chunk sizes cut from a shape the pieces do not make (on 4 ranks only the last one's
    # piece differs): the C++ layout check raises on every rank.
    with pytest.raises(ValueError, match="passed a local tensor of shape"):
        ShardTensor.from_local(chunk, mesh, [st.Shard(0)], "chunk", global_shape=(11, 3))
    with pytest.raises(ValueError, match="differ"):
        ShardTensor.from_local(chunk, mesh, [st.Shard(0)], "chunk", global_shape=(10, 3), shape=(9, 3))


def _shared_root_checks(rank, world_size):
    """The sub-meshes of one mesh are sub-meshes of one torch root: torch joins them, and its
    FSDP2 shards a plain model over the joined mesh (HSDP), values as on one process."""
    from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = st.init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("ddp", "domain"))
    ddp, domain = mesh["ddp"], mesh["domain"]
    assert ddp._get_root_mesh() is domain._get_root_mesh() is mesh.to_torch()
    joined = TorchDeviceMesh._concatenate([ddp.to_torch(), domain.to_torch()])
    assert joined.mesh.tolist() == mesh.mesh.tolist() and joined.mesh_dim_names == ("ddp", "domain")
    torch.manual_seed(0)
    single = torch.nn.Linear(4, 6)
    model = copy.deepcopy(single)
    fully_shard(model, mesh=joined)
    batches = torch.randn(world_size, 3, 4)
    model(batches[rank]).pow(2).mean().backward()
    (sum(single(b).pow(2).mean() for b in batches) / world_size).backward()
    for (name, p), q in zip(model.named_parameters(), single.parameters()):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, msg=name)


def _dtensor_operand_checks(rank, world_size, mesh):
    """torch DTensors beside ShardTensors: torch's distribute_module on our mesh (the module deep-
    copied, then trained), DTensors on torch's mesh of ours and on a sub-mesh, against one process;
    a DTensor on an unrelated mesh is an error naming both meshes."""
    from torch.distributed.tensor import DTensor, distribute_module
    from torch.distributed.tensor import distribute_tensor as torch_distribute

    torch.manual_seed(0)
    single = torch.nn.Conv2d(2, 3, 3, padding=1).double()
    field = torch.randn(2, 2, 9, 5, dtype=torch.float64)
    distributed = copy.deepcopy(single)
    distribute_module(distributed, mesh)                   # torch's: the weights become DTensors
    model = copy.deepcopy(distributed)                      # PhysicsNeMo's programs copy such modules
    assert isinstance(model.weight, DTensor) and model.weight is not distributed.weight
    x = st.distribute_tensor(field, mesh, [st.Shard(2)])    # 9 rows: uneven, an empty piece at 4 ranks
    opt, single_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(single.parameters(), lr=0.1)
    for step in range(3):
        y = model(x)
        assert st.is_shard_tensor(y) and y.placements == (st.Shard(2),)
        expected = single(field)
        torch.testing.assert_close(y.full_tensor(), expected, msg=f"step {step}: output")
        y.pow(2).sum().backward()
        expected.pow(2).sum().backward()
        for name, p in model.named_parameters():
            q = dict(single.named_parameters())[name]
            assert isinstance(p.grad, DTensor) and p.grad.placements == p.placements, (name, type(p.grad))
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, msg=f"step {step}: {name}.grad")
        opt.step(), single_opt.step(), opt.zero_grad(), single_opt.zero_grad()
    torch.testing.assert_close(model.weight.full_tensor(), single.weight.detach(), msg="trained weight")

    # A DTensor on torch's own mesh over our mesh's groups, as an operand of a method and of torch.*.
    g = torch.arange(30.0).reshape(10, 3)
    d = torch_distribute(g.flip(0), mesh.to_torch(), [TShard(0)])
    xs = st.distribute_tensor(g, mesh, [st.Replicate()])
    torch.testing.assert_close(xs.mul(d).full_tensor(), g * g.flip(0))
    torch.testing.assert_close(torch.add(d, xs).full_tensor(), g + g.flip(0))

    # On a sub-mesh of the ShardTensors' mesh: the other dim replicates it.
    shape = (2, world_size // 2) if world_size % 2 == 0 else (1, world_size)
    grid = st.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    wide = torch.arange(42.0).reshape(7, 6)
    xg = st.distribute_tensor(wide, grid, [st.Shard(0), st.Shard(1)]).requires_grad_()
    for tp in (grid["tp"], grid.to_torch()["tp"]):          # ours, and torch's sub-mesh of its mesh
        bias = torch_distribute(torch.arange(6.0), tp, [TShard(0)]).requires_grad_()
        out = xg * 2 + bias
        torch.testing.assert_close(out.full_tensor(), wide * 2 + torch.arange(6.0))
        out.sum().backward()
        assert isinstance(bias.grad, DTensor) and bias.grad.device_mesh == tp and bias.grad.placements == (TShard(0),)
        torch.testing.assert_close(bias.grad.full_tensor(), torch.full((6,), 7.0))
    if world_size == 1:
        return                                             # dp and tp are both the one rank: one mesh
    stranger = torch_distribute(torch.ones(6), grid["dp"], [TReplicate()])
    with pytest.raises(ValueError, match=r"a torch DTensor on DeviceMesh.*'dp'.* met ShardTensors on DeviceMesh.*sub-mesh"):
        st.distribute_tensor(torch.ones(6), grid["tp"], [st.Replicate()]) + stranger


def mix_body(rank, world_size, blob_path=None):
    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(30.0).reshape(10, 3)
    _placement_checks(mesh, g)
    _mesh_checks(rank, world_size, mesh, blob_path)
    _sync_checks(rank, world_size, mesh)
    _handler_checks(rank, world_size, mesh, g)
    _global_shape_checks(rank, world_size, mesh, g)
    _dtensor_operand_checks(rank, world_size, mesh)
    if world_size % 2 == 0:
        _shared_root_checks(rank, world_size)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_torch_mix(world_size, tmp_path):
    blob = tmp_path / "mesh.pickle"
    run_ranks(mix_body, world_size, str(blob))
    if world_size > 1:
        # This process has no mesh of several ranks: unpickling one names what is missing.
        missing = re.escape(f"ranks {list(range(world_size))}): no such mesh lives in this process")
        with pytest.raises(RuntimeError, match=missing):
            pickle.loads(blob.read_bytes())
