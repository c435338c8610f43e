"""Issue 75, prefetch: fully_shard's all-gathers started ahead of the module that needs them
(FSDP2's set_modules_to_forward_prefetch / set_modules_to_backward_prefetch and
unshard(async_op=True)), run on the prefetch stream over its own process groups, against one
process.

- FSDP alone (1-4 ranks; hidden widths the world size divides, does not divide, and leaves empty
  shards): parameters after 10 AdamW steps equal one process's; every gather configured was
  prefetched and taken; a step's collectives and bytes are the same as without prefetch;
- FSDP x TP (2x2, uneven): the same against one process;
- a prefetched gather whose parameter changed before it was taken (an optimizer step after
  unshard(async_op=True)) is not used: the forward computes with the new values;
- bad input: a module that is not fully sharded is a clear error on every rank.
A rank that fails inside a prefetched gather: test_fsdp_faults.py.
"""

import copy

import pytest
import torch

from oracle import assert_close
from ranks import run_ranks
from test_fsdp import MLP, _assert_parameters, _batches, _one_process, _train, _wrap


def with_prefetch(model):
    """FSDP2's explicit prefetch, as torchtitan configures it: each forward starts the next
    module's gathers, each backward the previous one's."""
    model.set_modules_to_forward_prefetch([model.w1])
    model.w1.set_modules_to_forward_prefetch([model.w2])
    model.set_modules_to_backward_prefetch([model.w2])
    model.w2.set_modules_to_backward_prefetch([model.w1])
    return model


def _counts():
    from shardtensor.fsdp import _prefetch

    return _prefetch.STATISTICS.started, _prefetch.STATISTICS.taken


def prefetch_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
    batches = _batches(world_size)
    for hidden in (4 * world_size, 27, 3):
        torch.manual_seed(hidden)
        reference = MLP(hidden)
        expected = _one_process(copy.deepcopy(reference), batches)
        model = with_prefetch(_wrap(copy.deepcopy(reference), mesh))
        gathers, taken = _counts()
        _train(model, batches, rank)
        _assert_parameters(model, expected, f"prefetch, hidden {hidden}")
        # Per step: the forward prefetches w1's and w2's weight and bias; the backward w2.weight,
        # the one parameter of w1 and w2 it reads again (w1's input needs no gradient). Every
        # one is taken by the gather it stands in for.
        assert _counts() == (gathers + 5 * 10, taken + 5 * 10), (_counts(), gathers, taken)

    # The same collectives and bytes as the same step without prefetch (the prefetched gathers
    # count in the CommDebugMode that was active where they started).
    torch.manual_seed(0)
    reference = MLP(27)
    x = batches[0][rank]
    sent = {}
    for name, model in (("plain", _wrap(copy.deepcopy(reference), mesh)),
                        ("prefetch", with_prefetch(_wrap(copy.deepcopy(reference), mesh)))):
        with st.CommDebugMode() as comms:
            model(x).pow(2).mean().backward()
        sent[name] = (comms.get_comm_counts(), comms.get_bytes())
    assert sent["plain"] == sent["prefetch"], sent

    # Stale gathers are not used: unshard(async_op=True), then an optimizer step, then forward.
    model = with_prefetch(_wrap(copy.deepcopy(reference), mesh))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    one = copy.deepcopy(reference)
    one_opt = torch.optim.AdamW(one.parameters(), lr=0.1)
    model(x).pow(2).mean().backward()
    (sum(one(b).pow(2).mean() for b in batches[0]) / world_size).backward()
    gathers, taken = _counts()
    handle = model.w1.unshard(async_op=True)
    opt.step()
    one_opt.step()
    with torch.no_grad():
        assert_close(model(x), one(x), "forward after unshard(async_op=True) and a step")
    # The forward waited for the handle; w1's two gathers ran and were left (the step changed
    # the parameters), and w1 was gathered again; w2's two, prefetched by w1's forward, were taken.
    assert _counts() == (gathers + 4, taken + 2), (_counts(), gathers, taken)
    handle.wait()  # a second wait does nothing
    model.w1.reshard()
    gathers, taken = _counts()
    handle = model.w1.unshard(async_op=True)  # no step in between: taken
    with torch.no_grad():
        assert_close(model(x), one(x), "forward after unshard(async_op=True)")
    assert _counts() == (gathers + 4, taken + 4), (_counts(), gathers, taken)
    model.w1.reshard()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_prefetched_gathers_match_one_process(world_size):
    run_ranks(prefetch_body, world_size)


def tp_prefetch_body(rank, world_size):
    import shardtensor as st
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    batches = _batches(2)
    for hidden in (27, 3):
        torch.manual_seed(hidden)
        reference = MLP(hidden)
        expected = _one_process(copy.deepcopy(reference), batches)
        model = parallelize_module(copy.deepcopy(reference), mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        with_prefetch(_wrap(model, mesh["dp"]))
        gathers, _ = _counts()
        _train(model, batches, mesh.get_coordinate()[0])
        _assert_parameters(model, expected, f"FSDP x TP with prefetch, hidden {hidden}")
        assert _counts()[0] == gathers + 5 * 10


def test_prefetch_with_tensor_parallelism():
    run_ranks(tp_prefetch_body, 4)


def bad_prefetch_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
    model = _wrap(MLP(), mesh)
    with pytest.raises(ValueError, match="set_modules_to_forward_prefetch: expected fully sharded modules .*Linear"):
        model.set_modules_to_forward_prefetch([torch.nn.Linear(2, 2)])


def test_prefetch_bad_input_is_a_clear_error_on_every_rank():
    run_ranks(bad_prefetch_body, 2)
