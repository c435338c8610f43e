"""torch.nn on ShardTensors: modules, loss.backward(), torch.optim, gradient clipping and
no_grad, trained on uneven splits and compared with the same training on one process."""

import copy

import pytest
import torch

from oracle import assert_close, chunk_sizes
from ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4]


def shard_parameters(module, mesh, placements_of):
    """Replaces every parameter by a ShardTensor parameter laid out by placements_of(name, p)."""
    import shardtensor as st

    for module_name, m in module.named_modules():
        for name, p in list(m.named_parameters(recurse=False)):
            full_name = f"{module_name}.{name}" if module_name else name
            sharded = st.distribute_tensor(p.detach(), mesh, placements_of(full_name, p))
            setattr(m, name, torch.nn.Parameter(sharded))
    return module


def train(model, optimizer, batches, steps, clip):
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        x, y = batches[step % len(batches)]
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        losses.append(loss)
    return losses


def compare_parameters(sharded, single, what, rtol=1e-9, atol=1e-10):
    for (name, p), (_, q) in zip(sharded.named_parameters(), single.named_parameters()):
        assert_close(p.full_tensor(), q, f"{what}: parameter {name}", rtol=rtol, atol=atol)


def mlp_body(rank, world_size, tensor_parallel, foreach):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    single = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()
    model = copy.deepcopy(single)
    if tensor_parallel:  # column-parallel, then row-parallel (7 hidden units: uneven)
        layout = {"0.weight": [st.Shard(0)], "0.bias": [st.Shard(0)], "2.weight": [st.Shard(1)]}
        shard_parameters(model, mesh, lambda name, p: layout.get(name, [st.Replicate()]))
    else:
        shard_parameters(model, mesh, lambda name, p: [st.Replicate()])
    # 13 samples split by rows (uneven; an empty shard on 4 ranks with 2 samples per batch).
    data = [(torch.randn(13, 5, dtype=torch.float64), torch.randn(13, 3, dtype=torch.float64)),
            (torch.randn(2, 5, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64))]
    batch_layout = [st.Replicate()] if tensor_parallel else [st.Shard(0)]
    sharded_data = [(st.distribute_tensor(x, mesh, batch_layout), st.distribute_tensor(y, mesh, batch_layout))
                    for x, y in data]
    opt = torch.optim.Adam(model.parameters(), lr=0.05, foreach=foreach)
    opt_single = torch.optim.Adam(single.parameters(), lr=0.05, foreach=foreach)
    sharded_losses = train(model, opt, sharded_data, 4, clip=0.5)
    single_losses = train(single, opt_single, data, 4, clip=0.5)
    for step, (a, b) in enumerate(zip(sharded_losses, single_losses)):
        assert_close(a.full_tensor(), b.detach(), f"loss at step {step}", rtol=1e-9, atol=1e-12)
    compare_parameters(model, single, "after Adam with clipping")
    # Gradients keep the parameter's mesh, and a sharded parameter's gradient stays sharded.
    for p in model.parameters():
        assert p.grad is not None and st.is_shard_tensor(p.grad)
        if p.placements[0].is_shard():
            assert p.grad.placements == p.placements
    with torch.no_grad():
        out = model(sharded_data[0][0])
    assert not out.requires_grad and out.grad_fn is None
    assert_close(out.full_tensor(), single(data[0][0]).detach(), "no_grad forward", rtol=1e-9, atol=1e-12)
    assert st.fallback_operators() == [], st.fallback_operators()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("tensor_parallel", [False, True], ids=["data_parallel", "tensor_parallel"])
def test_mlp_matches_one_process(world_size, tensor_parallel):
    run_ranks(mlp_body, world_size, tensor_parallel, world_size % 2 == 0)


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 4)
        self.pool = torch.nn.MaxPool2d(2)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.up = torch.nn.Upsample(scale_factor=2, mode="nearest")
        self.head = torch.nn.Conv2d(6, 1, 1)

    def forward(self, x):
        h = self.pool(torch.relu(self.norm(self.conv1(x))))
        h = self.up(torch.relu(self.conv2(h)))
        return self.head(torch.cat([h, x], dim=1))


def cnn_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    single = SmallCNN().double()
    model = shard_parameters(copy.deepcopy(single), mesh, lambda name, p: [st.Replicate()])
    x = torch.randn(2, 2, 16, 10, dtype=torch.float64)
    y = torch.randn(2, 1, 16, 10, dtype=torch.float64)
    # H split unevenly into even-sized pieces (pooling by 2 keeps them aligned), one empty on 4.
    sizes = {1: [16], 2: [10, 6], 3: [8, 6, 2], 4: [8, 0, 6, 2]}[world_size]
    xs = st.distribute_tensor(x, mesh, [st.Shard(2)], sharding_shapes={2: sizes})
    ys = st.distribute_tensor(y, mesh, [st.Shard(2)], sharding_shapes={2: sizes})
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_single = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9)
    sharded_losses = train(model, opt, [(xs, ys)], 3, clip=None)
    single_losses = train(single, opt_single, [(x, y)], 3, clip=None)
    for step, (a, b) in enumerate(zip(sharded_losses, single_losses)):
        assert_close(a.full_tensor(), b.detach(), f"CNN loss at step {step}", rtol=1e-9, atol=1e-12)
    compare_parameters(model, single, "CNN after SGD")
    # The input gradient of a split field is split the same way, with the oracle's values.
    xg = xs.detach().requires_grad_(True)
    xr = x.clone().requires_grad_(True)
    model(xg).sum().backward()
    single(xr).sum().backward()
    assert xg.grad.placements == (st.Shard(2),) and xg.grad.shard_sizes() == {2: sizes}
    assert_close(xg.grad.full_tensor(), xr.grad, "input gradient", rtol=1e-9, atol=1e-12)
    assert st.fallback_operators() == [], st.fallback_operators()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_cnn_on_a_split_field_matches_one_process(world_size):
    run_ranks(cnn_body, world_size)


def test_chunk_sizes_helper_matches_torch():
    assert chunk_sizes(10, 4) == [3, 3, 3, 1] and chunk_sizes(2, 4) == [1, 1, 0, 0]


def meta_init_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))

    def built(placement_of_weight):
        # Deferred initialisation, DTensor's recipe: build on meta, shard the parameters (no
        # values exist, none move), materialise each rank's piece with to_empty, then initialise.
        with torch.device("meta"):
            model = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 2)).double()
        shard_parameters(model, mesh, lambda name, p: placement_of_weight if name == "0.weight" else [st.Replicate()])
        assert all(p.to_local().is_meta for p in model.parameters())
        model.to_empty(device="cpu")
        st.manual_seed(11)
        for m in model:
            if isinstance(m, torch.nn.Linear):
                m.reset_parameters()
        return model

    sharded, replicated = built([st.Shard(0)]), built([st.Replicate()])
    weight = sharded[0].weight
    assert weight.placements == (st.Shard(0),) and not weight.to_local().is_meta
    assert weight.to_local().shape == (chunk_sizes(9, world_size)[rank], 6), "only this rank's piece exists"
    # The sharding-invariant generator: the same initial values whatever the layout.
    for (name, p), (_, q) in zip(sharded.named_parameters(), replicated.named_parameters()):
        assert_close(p.full_tensor(), q.full_tensor(), f"initial {name}", rtol=0, atol=0)
    # Kaiming-uniform bounds from the global fan-in: |w| <= 1/sqrt(6).
    assert weight.full_tensor().abs().max() <= 6 ** -0.5
    # It trains like any sharded module.
    x = st.distribute_tensor(torch.randn(5, 6, dtype=torch.float64), mesh, [st.Replicate()])
    sharded(x).sum().backward()
    assert weight.grad.placements == (st.Shard(0),)


@pytest.mark.parametrize("world_size", [1, 3])
def test_meta_initialisation_materialises_each_piece_only(world_size):
    run_ranks(meta_init_body, world_size)
