"""Issue 80: PhysicsNeMo's programs mix ShardTensors with torch's DTensor world.

- one placement vocabulary: shardtensor's placements are torch's (equal both ways, equal
  hashes, isinstance), with ZigzagShard and NormPartial equal to no plain Shard / Partial;
- meshes copy (a module holding one deep-copies) and pickle within a process;
- PhysicsNeMo's contracts: sync_module_over_mesh skips DTensors and raises RuntimeError for
  modules that differ; handler registries take any OpOverload and replace a handler registered
  twice; ShardTensor.from_local(..., global_shape=...) checks the shape on every rank.

The multi-rank checks run in one body per world size (1-4), each launch costing seconds.
"""

import copy
import pickle
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


def mix_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(30.0).reshape(10, 3)
    # Placements: torch's go in, ours come out, and they are the same.
    x = st.distribute_tensor(g, mesh, [TShard(0)])
    assert x.placements == (TShard(0),) and (TShard(0),) == x.placements
    assert {TShard(0): "rows"}[x.placements[0]] == "rows"
    s = x.sum(0)
    assert s.placements == (TPartial("sum"),) and isinstance(s.placements[0], TPartial)
    torch.testing.assert_close(s.full_tensor(), g.sum(0))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_torch_mix(world_size):
    run_ranks(mix_body, world_size)
