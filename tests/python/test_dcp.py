"""Issue 75: torch.distributed.checkpoint (DCP) and torch's state-dict utilities on ShardTensors,
with torch's real DCP (FileSystemWriter / FileSystemReader on real files) and default planners.

- a model under FSDP x TP (2x2, hidden width 27: uneven), with its AdamW state, saved by dcp.save
  on 4 ranks, loaded by dcp.load on 2, 3 and 4 ranks under other layouts (1-D FSDP, 3-way
  tensor parallelism, 4-way with the last layer split too), value for value against
  what the saving ranks held; the optimizer state too, through get/set_optimizer_state_dict;
- interop: a checkpoint of torch's FSDP2 + DTensor program loads into shardtensor's, and the
  reverse;
- get_model_state_dict / get_optimizer_state_dict with full_state_dict (and cpu_offload):
  plain whole tensors equal to the one-process model's; set_model_state_dict of a full state
  dict into a sharded model;
- dcp.async_save;
- a load whose shapes differ from the checkpoint's, and a missing key, raise on every rank; a
  rank dying during dcp.save is an error on the others and leaves the previous step loadable.
"""

import copy

import pytest
import torch

from oracle import assert_close
from ranks import run_ranks
from test_fsdp import MLP, _batches


def _whole(t):
    import shardtensor as st

    return t.full_tensor() if st.is_shard_tensor(t) else t.detach()


def _layout(model, world_size, layout):
    """The model laid out as `layout` says, on a fresh mesh of this world."""
    import shardtensor as st
    from shardtensor.fsdp import fully_shard
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if layout == "fsdp x tp":
        mesh = st.init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(model.w1, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    elif layout == "fsdp":
        mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
        fully_shard(model.w2, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif layout == "tp":
        mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
        parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    elif layout == "tp, w3 split":
        mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
        parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel(),
                                         "w3": ColwiseParallel(output_layouts=st.Replicate())})
    return model


def save_body(rank, world_size, path):
    """2x2 FSDP x TP, two AdamW steps, then dcp.save of the model and optimizer state; rank 0
    keeps the whole values the loaders must find (torch.save, the oracle)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = _layout(MLP(27), world_size, "fsdp x tp")
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    batches = _batches(2)
    dp_rank = model.w3.weight.device_mesh.get_coordinate()[0]
    for chunks in batches[:2]:
        model(chunks[dp_rank]).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    model_state, optim_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": optim_state}, storage_writer=dcp.FileSystemWriter(path))
    whole = {name: _whole(p) for name, p in model.named_parameters()}
    exp_avg = {name: _whole(opt.state[p]["exp_avg"]) for name, p in model.named_parameters()}
    if rank == 0:
        torch.save({"params": whole, "exp_avg": exp_avg}, f"{path}/oracle.pt")


def load_body(rank, world_size, path, layout):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    oracle = torch.load(f"{path}/oracle.pt")
    torch.manual_seed(1)  # other weights than the saved ones
    model = _layout(MLP(27), world_size, layout)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    model(torch.ones(1, 8, dtype=torch.float64)).sum().backward()  # the state exists, as after a step
    opt.step()
    opt.zero_grad()
    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, storage_reader=dcp.FileSystemReader(path))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for name, p in model.named_parameters():
        assert_close(_whole(p), oracle["params"][name], f"{layout} on {world_size}: {name}", rtol=0, atol=0)
        assert_close(_whole(opt.state[p]["exp_avg"]), oracle["exp_avg"][name], f"{layout} on {world_size}: exp_avg of {name}",
                     rtol=0, atol=0)


@pytest.mark.parametrize("world_size, layout", [(2, "fsdp"), (3, "tp"), (4, "tp, w3 split"), (4, "fsdp x tp")])
def test_dcp_save_on_4_ranks_load_on_other_layouts(tmp_path_factory, world_size, layout):
    path = tmp_path_factory.getbasetemp() / "fsdp_x_tp_checkpoint"
    if not (path / ".metadata").exists():
        run_ranks(save_body, 4, str(path))
    run_ranks(load_body, world_size, str(path), layout)


def _torch_layout(model, mesh):
    """torch's own: DTensor tensor parallelism on "tp", FSDP2 on "dp"."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(model, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    fully_shard(model.w1, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def interop_body(rank, world_size, path):
    """DTensor / FSDP2's checkpoint into shardtensor's model, and shardtensor's into theirs."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    reference = MLP(28)  # even: DTensor's side needs it
    theirs = _torch_layout(copy.deepcopy(reference), init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")))
    dcp.save({"model": theirs.state_dict()}, storage_writer=dcp.FileSystemWriter(f"{path}/from_dtensor"))
    ours = _layout(MLP(28), world_size, "fsdp x tp")
    state = {"model": ours.state_dict()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(f"{path}/from_dtensor"))
    ours.load_state_dict(state["model"])
    for (name, p), (_, q) in zip(ours.named_parameters(), reference.named_parameters()):
        assert_close(_whole(p), q.detach(), f"DTensor's checkpoint in shardtensor: {name}", rtol=0, atol=0)

    torch.manual_seed(2)
    reference = MLP(28)
    ours = _layout(copy.deepcopy(reference), world_size, "fsdp x tp")
    dcp.save({"model": ours.state_dict()}, storage_writer=dcp.FileSystemWriter(f"{path}/from_shardtensor"))
    theirs = _torch_layout(MLP(28), init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")))
    state = {"model": theirs.state_dict()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(f"{path}/from_shardtensor"))
    theirs.load_state_dict(state["model"])
    for (name, p), (_, q) in zip(theirs.named_parameters(), reference.named_parameters()):
        assert_close(p.full_tensor(), q.detach(), f"shardtensor's checkpoint in DTensor: {name}", rtol=0, atol=0)


def test_dcp_interop_with_dtensor_and_fsdp2(tmp_path):
    run_ranks(interop_body, 4, str(tmp_path))


def state_dict_body(rank, world_size):
    """Full state dicts (plain whole tensors, as torch gives for DTensor models) of TP, FSDP and
    FSDP x TP models, with and without cpu_offload; a full state dict loaded back, given on every
    rank or broadcast from rank 0."""
    import shardtensor as st
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict, set_model_state_dict)

    torch.manual_seed(0)
    reference = MLP(27)
    for layout in ("tp", "fsdp", "fsdp x tp"):
        model = _layout(copy.deepcopy(reference), world_size, layout)
        for cpu_offload in (False, True):
            options = StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)
            full = get_model_state_dict(model, options=options)
            if cpu_offload and rank != 0:
                assert full == {}, f"{layout}: cpu_offload keeps the full state dict on rank 0 only"
                continue
            assert set(full) == set(reference.state_dict())
            for name, value in reference.state_dict().items():
                assert not st.is_shard_tensor(full[name]), f"{layout}: {name} is still a ShardTensor"
                assert_close(full[name], value, f"{layout} full state dict: {name}", rtol=0, atol=0)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        model(torch.ones(2, 8, dtype=torch.float64)).sum().backward()
        opt.step()
        full_optim = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
        for name, p in model.named_parameters():
            state = full_optim["state"][name]
            assert not st.is_shard_tensor(state["exp_avg"]) and state["exp_avg"].shape == p.shape, f"{layout}: {name}"
            assert_close(state["exp_avg"], _whole(opt.state[p]["exp_avg"]), f"{layout}: exp_avg of {name}", rtol=0, atol=0)
        # A full state dict back into the sharded model: every rank's, then rank 0's broadcast.
        for seed, broadcast in ((5, False), (6, True)):
            torch.manual_seed(seed)
            other = MLP(27)
            given = other.state_dict() if rank == 0 or not broadcast else {}
            set_model_state_dict(model, given, options=StateDictOptions(full_state_dict=True,
                                                                        broadcast_from_rank0=broadcast))
            for (name, p), (_, q) in zip(model.named_parameters(), other.named_parameters()):
                assert_close(_whole(p), q.detach(), f"{layout}: set_model_state_dict (broadcast_from_rank0="
                             f"{broadcast}) {name}", rtol=0, atol=0)


def test_state_dict_utilities_give_full_tensors():
    run_ranks(state_dict_body, 4)


def mismatch_body(rank, world_size, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    torch.manual_seed(0)
    model = _layout(MLP(27), world_size, "fsdp x tp")
    dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(path))
    wider = _layout(MLP(30), world_size, "fsdp x tp")
    # DCP raises a CheckpointException (a BaseException) on every rank, each rank's failure in it.
    with pytest.raises(CheckpointException) as raised:
        dcp.load({"model": wider.state_dict()}, storage_reader=dcp.FileSystemReader(path))
    assert set(raised.value.failures) == set(range(world_size))
    assert "Size mismatch between saved torch.Size([27, 8]) and current: torch.Size([30, 8]) for model.w1.weight" in \
        str(raised.value.failures[rank])
    extra = model.state_dict()
    extra["w4.weight"] = extra["w3.weight"]
    with pytest.raises(CheckpointException) as raised:
        dcp.load({"model": extra}, storage_reader=dcp.FileSystemReader(path))
    assert "model.w4.weight" in str(raised.value.failures[rank]), raised.value.failures[rank]


def test_dcp_load_of_other_shapes_or_missing_keys_raises_on_every_rank(tmp_path):
    run_ranks(mismatch_body, 4, str(tmp_path))


def dies_during_save_body(rank, world_size, path):
    """Step 1 saved; the last rank dies while writing step 2: the others raise within the
    collective timeout, and step 2 has no .metadata (DCP will not load it as complete)."""
    import os
    import time

    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = _layout(MLP(27), world_size, "fsdp x tp")
    dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(f"{path}/step-1"))
    whole = {name: _whole(p) for name, p in model.named_parameters()}  # collective: on every rank
    if rank == 0:
        torch.save(whole, f"{path}/oracle.pt")
    torch.distributed.barrier()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    if rank == world_size - 1:
        def die(self, *args, **kwargs):
            os._exit(0)
        dcp.FileSystemWriter.write_data = die
    started = time.monotonic()
    outcome = "no error"
    try:
        dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(f"{path}/step-2"))
    except BaseException as error:  # noqa: BLE001 - DCP raises CheckpointException, a BaseException
        outcome = f"raised {type(error).__name__}"
    with open(f"{path}/rank{rank}", "w") as f:
        f.write(f"{time.monotonic() - started:.1f}\n{outcome}\n")
    os._exit(0)  # the group is broken: leave without the exit handlers' collectives


def load_step_1_body(rank, world_size, path):
    import torch.distributed.checkpoint as dcp

    oracle = torch.load(f"{path}/oracle.pt")
    model = _layout(MLP(27), world_size, "fsdp")
    state = {"model": model.state_dict()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(f"{path}/step-1"))
    model.load_state_dict(state["model"])
    for name, p in model.named_parameters():
        assert_close(_whole(p), oracle[name], f"step 1 after the failed step 2: {name}", rtol=0, atol=0)


def test_a_rank_dying_during_dcp_save_is_an_error_and_the_previous_checkpoint_loads(tmp_path):
    from ranks import COLLECTIVE_TIMEOUT_S

    run_ranks(dies_during_save_body, 4, str(tmp_path), timeout=120)
    for rank in range(3):
        took, outcome = (tmp_path / f"rank{rank}").read_text().splitlines()
        assert outcome.startswith("raised"), f"rank {rank} finished dcp.save although rank 3 died: {outcome}"
        assert float(took) <= float(COLLECTIVE_TIMEOUT_S) + 15, f"rank {rank} raised after {took} s"
    assert not (tmp_path / "step-2" / ".metadata").exists()
    run_ranks(load_step_1_body, 2, str(tmp_path))


def async_save_body(rank, world_size, path):
    """dcp.async_save: the training may go on while it writes; once its future is done, the
    checkpoint loads into another layout with the values of the moment it was taken."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = _layout(MLP(27), world_size, "fsdp")
    taken = {name: _whole(p) for name, p in model.named_parameters()}
    future = dcp.async_save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(path))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2)  # changed while the save may still be writing
    future.result()
    other = _layout(MLP(27), world_size, "tp")
    state = {"model": other.state_dict()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(path))
    other.load_state_dict(state["model"])
    for name, p in other.named_parameters():
        assert_close(_whole(p), taken[name], f"async_save: {name}", rtol=0, atol=0)


def test_dcp_async_save(tmp_path):
    run_ranks(async_save_body, 2, str(tmp_path))


def export_body(rank, world_size, path):
    """A Hugging Face-style export: the full state dict of a model under FSDP x TP, written by rank
    0 with safetensors, equals the one-process model's file, tensor for tensor."""
    from safetensors.torch import load_file, save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    torch.manual_seed(0)
    reference = MLP(27)
    model = _layout(copy.deepcopy(reference), world_size, "fsdp x tp")
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        save_file(full, f"{path}/model.safetensors")
        save_file(reference.state_dict(), f"{path}/one_process.safetensors")
        exported, expected = load_file(f"{path}/model.safetensors"), load_file(f"{path}/one_process.safetensors")
        assert exported.keys() == expected.keys()
        for name in expected:
            assert torch.equal(exported[name], expected[name]), name


def test_full_state_dict_exports_to_safetensors(tmp_path):
    run_ranks(export_body, 4, str(tmp_path))
