"""PhysicsNeMo's recipe: plain weights beside ShardTensor activations, with no scope.

A plain tensor next to ShardTensors counts as Replicate; a plain parameter's gradient is a plain
tensor equal to one process's, reduced once per backward however many operators used it, and
parameters stay bit-identical over the mesh through training. On a 2x2 ("dp", "domain") mesh,
torch's DDP and FSDP2 (given shardtensor's own mesh) average over "dp" on top. World sizes 1-4,
uneven splits and an empty shard, each against one process."""

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from ranks import run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _demo_unet():
    """The demo's U-Net (examples/heat_unet_demo.py), in double precision."""
    spec = importlib.util.spec_from_file_location("heat_unet_demo", os.path.join(REPO, "examples", "heat_unet_demo.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo.UNet


def _split_sizes(total, world_size):
    """Uneven H pieces of even sizes (the demo's pooling alignment), one empty at 4 ranks."""
    return {1: [total], 2: [10, total - 10], 3: [8, 12, total - 20], 4: [10, 0, 8, total - 18]}[world_size]


def unet_body(rank, world_size):
    """The demo's U-Net, plain weights and buffers, input split over H: values, plain gradients
    and BatchNorm's running statistics equal one process's; one reduction per parameter."""
    import shardtensor as st

    torch.manual_seed(0)
    UNet = _demo_unet()
    model = UNet().double()
    reference = UNet().double()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 1, 26, 14, dtype=torch.float64)
    target = torch.randn(2, 1, 26, 14, dtype=torch.float64)
    expected = reference(x)
    F.mse_loss(expected, target).backward()

    mesh = st.init_device_mesh("cpu", (world_size,))
    sizes = {2: _split_sizes(26, world_size)}
    xs = st.distribute_tensor(x, mesh, [st.Shard(2)], sharding_shapes=sizes)
    ts = st.distribute_tensor(target, mesh, [st.Shard(2)], sharding_shapes=sizes)
    with st.CommDebugMode() as comms:
        out = model(xs)
        loss = F.mse_loss(out, ts)
        loss.backward()
    torch.testing.assert_close(out.full_tensor(), expected, rtol=1e-10, atol=1e-12)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert type(p.grad) is torch.Tensor and not st.is_shard_tensor(p.grad), f"{name}.grad is {type(p.grad)}"
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=lambda m: f"{name}.grad: {m}")
    for (name, b), c in zip(model.named_buffers(), reference.buffers()):
        assert not st.is_shard_tensor(b), name
        torch.testing.assert_close(b, c, rtol=1e-10, atol=1e-12, msg=lambda m: f"buffer {name}: {m}")
    # Each of the 12 parameters' gradients is reduced once, never once per operator that used
    # it; the two more all-reduces are GroupNorm's and BatchNorm's statistics over the split H.
    params = len(list(model.parameters()))
    assert comms.get_comm_counts().get("all_reduce", 0) == (params + 2 if world_size > 1 else 0), comms.get_comm_counts()


def reuse_body(rank, world_size):
    """A weight used by ten operators is all-reduced once per backward, not ten times."""
    import shardtensor as st

    torch.manual_seed(1)
    layer = torch.nn.Linear(6, 6).double()
    reference = torch.nn.Linear(6, 6).double()
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(13, 6, dtype=torch.float64)

    def ten_times(f, v):
        for _ in range(10):
            v = torch.tanh(f(v))
        return v.sum()

    ten_times(reference, x).backward()
    mesh = st.init_device_mesh("cpu", (world_size,))
    xs = st.distribute_tensor(x, mesh, [st.Shard(0)])
    for step in range(2):  # the second backward accumulates into .grad: it must not be re-reduced
        with st.CommDebugMode() as comms:
            loss = ten_times(layer, xs)
            loss.backward()
        assert comms.get_comm_counts().get("all_reduce", 0) == (2 if world_size > 1 else 0), comms.get_comm_counts()
        for p, q in zip(layer.parameters(), reference.parameters()):
            assert type(p.grad) is torch.Tensor
            torch.testing.assert_close(p.grad, (step + 1) * q.grad, rtol=1e-10, atol=1e-12)


def no_drift_body(rank, world_size):
    """100 Adam steps: the plain parameters stay bit-identical on every rank, and near one process's."""
    import torch.distributed as dist

    import shardtensor as st

    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Conv1d(3, 5, 3, padding=1), torch.nn.GELU(), torch.nn.Conv1d(5, 2, 3, padding=1))
    reference = torch.nn.Sequential(torch.nn.Conv1d(3, 5, 3, padding=1), torch.nn.GELU(), torch.nn.Conv1d(5, 2, 3, padding=1))
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    mesh = st.init_device_mesh("cpu", (world_size,))
    x = torch.randn(2, 3, 17)
    xs = st.distribute_tensor(x, mesh, [st.Shard(2)])
    for _ in range(100):
        opt.zero_grad()
        (model(xs) ** 2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        (reference(x) ** 2).mean().backward()
        ref_opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat, group=mesh.get_group())
    for other in gathered:
        assert torch.equal(other.view(torch.int32), flat.view(torch.int32)), "a rank's parameters drifted"
    torch.testing.assert_close(flat, torch.cat([p.detach().flatten() for p in reference.parameters()]),
                               rtol=1e-4, atol=1e-5)


def setting_body(rank, world_size):
    """set_implicit_replication(False) restores DTensor's refusal on every rank, naming the way
    out; implicit_replication() still opens it; bad values are a TypeError."""
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    xs = st.distribute_tensor(torch.ones(5, 3), mesh, [st.Shard(0)])
    weight = torch.nn.Parameter(torch.ones(3))
    assert st.is_implicit_replication()
    st.set_implicit_replication(False)
    try:
        assert not st.is_implicit_replication()
        with pytest.raises(RuntimeError, match="plain 1-d tensor .*'other'.*implicit replication is off"):
            xs * weight
        torch.testing.assert_close((xs * 2.0).full_tensor(), torch.full((5, 3), 2.0))  # scalars still count
        with st.implicit_replication():
            (xs * weight).sum().backward()
        assert type(weight.grad) is torch.Tensor
        torch.testing.assert_close(weight.grad, torch.full((3,), 5.0))
    finally:
        st.set_implicit_replication(True)
    with pytest.raises(TypeError, match="True or False"):
        st.set_implicit_replication("no")
    # A plain tensor is the whole tensor, not a piece: shapes that do not broadcast with the
    # global ones raise on every rank (the local pieces alone could have matched).
    with pytest.raises(RuntimeError, match="global shapes do not broadcast.*'other'.*from_local"):
        xs + torch.ones(2, 3)


def _halves_oracle(UNet, state, xs, targets, steps, make_opt):
    """One process: each step's gradient is the mean of the two dp halves' (DDP's meaning, with
    BatchNorm's statistics per half), then one Adam step."""
    model = UNet().double()
    model.load_state_dict(state)
    opt = make_opt(model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(F.mse_loss(model(x), t) for x, t in zip(xs, targets)) / len(xs)
        loss.backward()
        opt.step()
    return model


def _make_adam(params):
    return torch.optim.Adam(params, lr=1e-3)


def _dp_domain_problem(mesh, steps):
    """The U-Net problem of the ("dp", "domain") tests: the model class, its initial state, one
    batch half per dp rank and its targets, the optimizer, the one-process parameters after
    `steps` steps, and this rank's half split unevenly over "domain" (input and target)."""
    import shardtensor as st

    dp = mesh.get_coordinate()[0]
    torch.manual_seed(3)
    UNet = _demo_unet()
    state = UNet().double().state_dict()
    halves = [torch.randn(2, 1, 18, 10, dtype=torch.float64) for _ in range(2)]
    targets = [torch.randn(2, 1, 18, 10, dtype=torch.float64) for _ in range(2)]
    expected = _halves_oracle(UNet, state, halves, targets, steps, _make_adam).state_dict()
    xs = st.distribute_tensor(halves[dp], mesh["domain"], [st.Shard(2)], sharding_shapes={2: [10, 8]})
    ts = st.distribute_tensor(targets[dp], mesh["domain"], [st.Shard(2)], sharding_shapes={2: [10, 8]})
    return UNet, state, halves, targets, _make_adam, expected, xs, ts


def dp_domain_body(rank, world_size):
    """2x2 ("dp", "domain"): torch's DDP over mesh["dp"].get_group() and FSDP2 given
    shardtensor's own mesh["dp"] (reshard_after_forward both ways, a MixedPrecisionPolicy),
    activations split over "domain": parameters after 20 Adam steps equal one process's."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor, Shard as TorchShard, distribute_tensor

    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "domain"))
    dp = mesh.get_coordinate()[0]
    steps = 20
    UNet, state, halves, targets, make_opt, expected, xs, ts = _dp_domain_problem(mesh, steps)

    def train(model):
        opt = make_opt(model.parameters())
        for _ in range(steps):
            opt.zero_grad()
            F.mse_loss(model(xs), ts).backward()
            opt.step()

    ddp = UNet().double()
    ddp.load_state_dict(state)
    train(torch.nn.parallel.DistributedDataParallel(ddp, process_group=mesh["dp"].get_group()))
    for name, p in ddp.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name], rtol=1e-9, atol=1e-11, msg=lambda m: f"DDP {name}: {m}")

    # One gradient sum instead of two: DDP's buckets summed over all four ranks, shardtensor
    # handing it each rank's term of the domain sum with no message of its own.
    one_sum = UNet().double()
    one_sum.load_state_dict(state)
    wrapped = torch.nn.parallel.DistributedDataParallel(one_sum, process_group=mesh["dp"].get_group())
    st.parallel.sum_gradients_with_ddp(wrapped, mesh)
    F.mse_loss(wrapped(xs), ts).backward()  # the gradients themselves (Adam would hide a constant factor)
    reference = UNet().double()
    reference.load_state_dict(state)
    (sum(F.mse_loss(reference(x), t) for x, t in zip(halves, targets)) / 2).backward()
    for (name, p), r in zip(one_sum.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-9, atol=1e-12, msg=lambda m: f"gradient of {name}: {m}")
    with st.CommDebugMode() as comms:
        train(wrapped)
    plain_gradient_sums = comms.get_comm_counts_by_operator().get("redistribute", {})
    assert not plain_gradient_sums, f"shardtensor summed plain gradients itself: {plain_gradient_sums}"
    for name, p in one_sum.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name], rtol=1e-9, atol=1e-11,
                                   msg=lambda m: f"DDP with sum_gradients_with_ddp {name}: {m}")
    flat = torch.cat([p.detach().reshape(-1) for p in one_sum.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world_size)]
    torch.distributed.all_gather(everyone, flat)
    assert all(torch.equal(flat, other) for other in everyone), "parameters differ between ranks"
    with pytest.raises(ValueError, match="expected a mesh with a data-parallel dim"):
        st.parallel.sum_gradients_with_ddp(wrapped, mesh["domain"])

    for reshard in (True, False):
        fsdp = UNet().double()
        fsdp.load_state_dict(state)
        fully_shard(fsdp, mesh=mesh["dp"], reshard_after_forward=reshard,
                    mp_policy=MixedPrecisionPolicy(param_dtype=torch.float64, reduce_dtype=torch.float64))
        train(fsdp)
        for name, p in fsdp.named_parameters():
            assert isinstance(p, DTensor), name
            torch.testing.assert_close(p.full_tensor(), expected[name], rtol=1e-9, atol=1e-11,
                                       msg=lambda m: f"FSDP2 (reshard_after_forward={reshard}) {name}: {m}")

    # torch's own DTensor API takes shardtensor's mesh too.
    d = distribute_tensor(torch.arange(6.0), mesh["dp"], [TorchShard(0)])
    assert d.to_local().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]][dp]
    layer = torch.distributed.tensor.distribute_module(torch.nn.Linear(3, 2), mesh["domain"])
    assert isinstance(layer.weight, DTensor) and layer.weight.device_mesh is mesh["domain"]


def all_bodies(rank, world_size):
    unet_body(rank, world_size)
    reuse_body(rank, world_size)
    no_drift_body(rank, world_size)
    setting_body(rank, world_size)
    if world_size == 4:
        dp_domain_body(rank, world_size)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_plain_parameters_beside_shard_tensors(world_size):
    run_ranks(all_bodies, world_size, timeout=400)
