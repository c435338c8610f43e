"""shardtensor.checkpoint from Python: a model and its optimizer saved on one layout and world
size, loaded into another, train on exactly as an uninterrupted run does; bad checkpoints and
states raise on every rank."""

import os

import pytest
import torch

from oracle import assert_close
from ranks import run_ranks


def make_model():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))


def batches():
    g = torch.Generator().manual_seed(9)
    return [(torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)) for _ in range(6)]


def shard_model(model, mesh, placements_of):
    import shardtensor as st

    for module_name, m in model.named_modules():
        for name, p in list(m.named_parameters(recurse=False)):
            full = f"{module_name}.{name}" if module_name else name
            setattr(m, name, torch.nn.Parameter(st.distribute_tensor(p.detach(), mesh, placements_of(full, p))))
    return model


def train_steps(model, optimizer, data, first, last, to_input):
    import shardtensor as st

    losses = []
    for step in range(first, last):
        x, y = data[step]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(to_input(x)), to_input(y))
        loss.backward()
        optimizer.step()
        losses.append(loss.full_tensor() if st.is_shard_tensor(loss) else loss.detach())
    return losses


def row_sharded(st):
    # Output features of the first layer over the mesh (uneven at 3 and 4 ranks), the rest replicated.
    return lambda name, p: [st.Shard(0)] if name.startswith("0.") else [st.Replicate()]


def col_sharded(st):
    return lambda name, p: [st.Shard(1)] if name == "2.weight" else [st.Replicate()]


def state_of(model, optimizer, step):
    return {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step}


def save_body(rank, world_size, path):
    import shardtensor as st
    import shardtensor.checkpoint as ckpt

    mesh = st.init_device_mesh("cpu", (world_size,))
    model = shard_model(make_model(), mesh, row_sharded(st))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    replicate = lambda t: st.distribute_tensor(t, mesh, [st.Replicate()])  # noqa: E731
    train_steps(model, optimizer, batches(), 0, 3, replicate)
    ckpt.save(state_of(model, optimizer, 3), path, mesh=mesh)


def resume_body(rank, world_size, path):
    import shardtensor as st
    import shardtensor.checkpoint as ckpt

    mesh = st.init_device_mesh("cpu", (world_size,))
    model = shard_model(make_model(), mesh, col_sharded(st))  # another layout and world size
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    # A fresh Adam has no state to fill: one step with zero gradients creates it and moves nothing.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    state = state_of(model, optimizer, 0)
    ckpt.load(state, path, mesh=mesh)
    optimizer.load_state_dict(state["optim"])
    assert state["step"] == 3, state["step"]
    replicate = lambda t: st.distribute_tensor(t, mesh, [st.Replicate()])  # noqa: E731
    resumed = train_steps(model, optimizer, batches(), 3, 6, replicate)

    # The oracle: one process trains the same model six steps without stopping.
    single = make_model()
    single_opt = torch.optim.Adam(single.parameters(), lr=1e-2)
    losses = train_steps(single, single_opt, batches(), 0, 6, lambda t: t)
    for step, (got, want) in enumerate(zip(resumed, losses[3:]), start=3):
        assert_close(got, want, f"loss of step {step} after resuming")
    for (name, p), (_, q) in zip(model.named_parameters(), single.named_parameters()):
        assert_close(p.full_tensor(), q.detach(), f"parameter {name} after 6 steps")


@pytest.mark.parametrize("saved_at,loaded_at", [(4, 3), (2, 1), (3, 4)])
def test_model_and_optimizer_resume_on_another_layout(tmp_path, saved_at, loaded_at):
    path = str(tmp_path / "ckpt")
    run_ranks(save_body, saved_at, path)
    assert os.path.exists(os.path.join(path, "metadata.json"))
    run_ranks(resume_body, loaded_at, path)


def bad_checkpoint_body(rank, world_size, path):
    import shardtensor as st
    import shardtensor.checkpoint as ckpt

    mesh = st.init_device_mesh("cpu", (world_size,))
    w = st.distribute_tensor(torch.arange(12.0).reshape(4, 3), mesh, [st.Shard(0)])
    ckpt.save({"w": w, "lr": 0.5}, path, mesh=mesh)

    other = st.distribute_tensor(torch.zeros(4, 3), mesh, [st.Shard(1)])
    with pytest.raises(RuntimeError, match=r"missing from the checkpoint: \[missing\]"):
        ckpt.load({"w": other, "missing": torch.zeros(2)}, path, mesh=mesh)
    assert other.full_tensor().eq(0).all(), "a refused load must leave the state untouched"
    missing, unexpected = ckpt.load({"w": other, "missing": torch.zeros(2)}, path, strict=False, mesh=mesh)
    assert (missing, unexpected) == (["missing"], ["lr"])
    assert_close(other.full_tensor(), torch.arange(12.0).reshape(4, 3), "w loaded non-strictly into S(1)")

    wrong_shape = st.distribute_tensor(torch.zeros(5, 3), mesh, [st.Shard(0)])
    with pytest.raises(RuntimeError, match="shape"):
        ckpt.load({"w": wrong_shape, "lr": 0.0}, path, mesh=mesh)
    with pytest.raises(TypeError, match="'w' is a object"):
        ckpt.save({"w": object()}, path, mesh=mesh)
    with pytest.raises(RuntimeError, match="no checkpoint|metadata"):
        ckpt.load({"w": other}, path + "-nowhere", mesh=mesh)

    state = {"w": other, "lr": 0.0}
    ckpt.load(state, path, mesh=mesh)
    assert state["lr"] == 0.5 and isinstance(state["lr"], float)

    pending = ckpt.save_async({"w": w}, path + "-async", mesh=mesh)
    w.zero_()  # the save holds the values of the call
    pending.wait()
    ckpt.load(state, path + "-async", strict=False, mesh=mesh)
    assert_close(other.full_tensor(), torch.arange(12.0).reshape(4, 3), "w saved asynchronously")


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_bad_states_and_checkpoints_raise_on_every_rank(tmp_path, world_size):
    run_ranks(bad_checkpoint_body, world_size, str(tmp_path / "ckpt"))
