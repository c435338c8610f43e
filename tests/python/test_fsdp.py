"""Issue 75: sharded data parallelism on ShardTensor and plain parameters (shardtensor.fsdp,
FSDP2's API), against one process.

- FSDP alone (1-D "dp", world sizes 1-4): an MLP wrapped per layer and at the root, hidden
  widths the world size divides, does not divide (27) and leaves empty shards (3 over 4);
  parameters after 10 AdamW steps equal one process's, whose loss is the mean of the ranks'
  batches; with and without reshard_after_forward; bytes on the wire are the parameter bytes;
- FSDP x TP (2x2 ("dp", "tp"), Colwise / Rowwise, even and uneven), HSDP (2x2 ("replicate",
  "shard")), FSDP x domain (PhysicsNeMo's recipe: plain weights, activations split over
  "domain"), each against one process;
- bf16 MixedPrecisionPolicy against one process's bf16 run; gradient accumulation with
  set_requires_gradient_sync(False); unshard() / reshard();
- bad input: a clear error on every rank; torch's own fully_shard and DDP on ShardTensor parameters.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from oracle import assert_close
from ranks import run_ranks

STEPS = 10


class MLP(nn.Module):
    def __init__(self, hidden=27, dtype=torch.float64):
        super().__init__()
        self.w1 = nn.Linear(8, hidden, dtype=dtype)
        self.w2 = nn.Linear(hidden, 6, dtype=dtype)
        self.w3 = nn.Linear(6, 5, dtype=dtype)

    def forward(self, x):
        return self.w3(F.relu(self.w2(F.relu(self.w1(x)))))


def _wrap(model, mesh, **kwargs):
    from shardtensor.fsdp import fully_shard

    fully_shard(model.w1, mesh=mesh, **kwargs)
    fully_shard(model.w2, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)  # the root takes w3
    return model


def _batches(dp, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(dp * 3 + 1, 8, generator=g, dtype=dtype).tensor_split(dp) for _ in range(STEPS)]


def _one_process(reference, batches, steps=STEPS):
    """The oracle: each step's loss is the mean of the data-parallel ranks' losses (FSDP's and
    DDP's meaning), then one AdamW step."""
    opt = torch.optim.AdamW(reference.parameters(), lr=0.02, weight_decay=0.1)
    for chunks in batches[:steps]:
        opt.zero_grad()
        (sum(reference(x).pow(2).mean() for x in chunks) / len(chunks)).backward()
        opt.step()
    return reference


def _train(model, batches, dp_rank, steps=STEPS):
    opt = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.1)
    for chunks in batches[:steps]:
        opt.zero_grad()
        model(chunks[dp_rank]).pow(2).mean().backward()
        opt.step()
    return model


def _assert_parameters(model, reference, what, **tolerance):
    import shardtensor as st

    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert isinstance(p, st.ShardTensor), f"{what}: {name} is not a ShardTensor between steps"
        assert_close(p.full_tensor(), q.detach(), f"{what}: {name}", **tolerance)


def fsdp_body(rank, world_size):
    import shardtensor as st
    from shardtensor.fsdp import FSDPModule

    mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
    batches = _batches(world_size)
    for hidden in (4 * world_size, 27, 3):
        torch.manual_seed(hidden)
        reference = MLP(hidden)
        expected = _one_process(copy.deepcopy(reference), batches)
        for reshard in (True, False):
            what = f"hidden {hidden}, reshard_after_forward={reshard}"
            model = _wrap(copy.deepcopy(reference), mesh, reshard_after_forward=reshard)
            assert isinstance(model, FSDPModule) and isinstance(model.w1, FSDPModule) and type(model).__name__ == "FSDPMLP"
            assert [n for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]
            for name, p in model.named_parameters():
                assert p.placements == (st.Shard(0),), f"{what}: {name} {p.placements}"
                assert p.shard_sizes()[0] == [len(c) for c in torch.arange(p.shape[0]).chunk(world_size)] + \
                    [0] * (world_size - len(torch.arange(p.shape[0]).chunk(world_size))), f"{what}: {name}"
            _train(model, batches, rank)
            _assert_parameters(model, expected, what)
            assert set(model.state_dict()) == set(reference.state_dict())

    # reshard_after_forward (FSDP2's default: every module but the root): between forward and
    # backward only the root's parameters stay unsharded; the backward gathers the others again.
    torch.manual_seed(0)
    reference = MLP(27)
    model = _wrap(copy.deepcopy(reference), mesh)
    x = batches[0][rank]
    with st.CommDebugMode() as comms:
        loss = model(x).pow(2).mean()
    held = {name: p._fsdp_param.last_unsharded() is not None for name, p in model.named_parameters()}
    assert held == {"w1.weight": False, "w1.bias": False, "w2.weight": False, "w2.bias": False,
                    "w3.weight": True, "w3.bias": True}, held
    forward_gathers = comms.get_comm_counts().get("all_gather", 0)
    with st.CommDebugMode() as comms:
        loss.backward()
    if world_size > 1:
        # again for w2.weight only: the input's gradient needs it; w1's input needs none, and
        # the biases' and weights' own gradients need no parameter
        assert comms.get_comm_counts() == {"all_gather": 1, "reduce_scatter": 6}, comms.get_comm_counts()
        assert forward_gathers == 6
    (sum(reference(x).pow(2).mean() for x in batches[0]) / world_size).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert_close(p.grad.full_tensor(), q.grad, f"gradient of {name} after resharding")

    # Bytes on the wire: each all-gather and reduce-scatter moves every piece to the other
    # ranks once, nothing for padding (27 rows over 4 is 7, 7, 7, 6).
    model = _wrap(MLP(27), mesh, reshard_after_forward=False)
    with st.CommDebugMode() as comms:
        y = model(x)
    forward = comms.get_bytes()
    with st.CommDebugMode() as comms:
        y.sum().backward()
    backward = comms.get_bytes()
    assert comms.get_comm_counts() == ({"reduce_scatter": 6} if world_size > 1 else {}), comms.get_comm_counts()
    sent = torch.tensor([forward, backward], dtype=torch.float64)
    torch.distributed.all_reduce(sent)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sent.tolist() == [parameter_bytes * (world_size - 1)] * 2, (sent.tolist(), parameter_bytes)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_fsdp_matches_one_process(world_size):
    run_ranks(fsdp_body, world_size)


def tp_body(rank, world_size):
    import shardtensor as st
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh.get_coordinate()[0]
    batches = _batches(2)
    plan = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
    for hidden in (8, 27, 3):
        torch.manual_seed(hidden)
        reference = MLP(hidden)
        expected = _one_process(copy.deepcopy(reference), batches)
        model = parallelize_module(copy.deepcopy(reference), mesh["tp"], plan)
        _wrap(model, mesh["dp"])
        w1 = model.w1.weight
        # "dp" nested inside "tp": the tp piece of the rows, split again over dp.
        assert w1.placements == (st.Shard(0), st.Shard(0)) and w1.device_mesh.mesh_dim_names == ("tp", "dp")
        assert model.w2.weight.placements == (st.Shard(1), st.Shard(0))
        _train(model, batches, dp_rank)
        _assert_parameters(model, expected, f"FSDP x TP, hidden {hidden}")

    # HSDP: replicated over "replicate", sharded over "shard".
    hsdp = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(5)
    reference = MLP(27)
    expected = _one_process(copy.deepcopy(reference), _batches(4))
    model = _wrap(copy.deepcopy(reference), hsdp)
    assert model.w1.weight.placements == (st.Replicate(), st.Shard(0))
    _train(model, _batches(4), rank)
    _assert_parameters(model, expected, "HSDP")


def test_fsdp_with_tensor_parallelism_and_hsdp():
    run_ranks(tp_body, 4)


def domain_body(rank, world_size):
    """PhysicsNeMo's recipe with shardtensor's fully_shard: plain weights, activations split over
    "domain", FSDP over "dp": parameters after 20 Adam steps equal one process's."""
    from test_plain_params import _dp_domain_problem

    import shardtensor as st
    from shardtensor.fsdp import fully_shard

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "domain"))
    UNet, state, _, _, make_opt, expected, xs, ts = _dp_domain_problem(mesh, 20)
    model = UNet().double()
    model.load_state_dict(state)
    fully_shard(model, mesh=mesh["dp"])
    opt = make_opt(model.parameters())
    for _ in range(20):
        opt.zero_grad()
        F.mse_loss(model(xs), ts).backward()
        opt.step()
    for name, p in model.named_parameters():
        assert_close(p.full_tensor(), expected[name], f"FSDP x domain {name}", rtol=1e-9, atol=1e-11)


def test_fsdp_with_domain_parallelism():
    run_ranks(domain_body, 4)


def mixed_precision_body(rank, world_size):
    """param_dtype=bf16, reduce_dtype=fp32: the forward computes in bf16 like one process's
    model cast to bf16, gradients are reduced in fp32 and the fp32 parameters step; without
    reduce_dtype they are reduced in bf16 (FSDP2's default)."""
    import shardtensor as st
    from shardtensor.fsdp import MixedPrecisionPolicy

    mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
    batches = _batches(world_size, dtype=torch.float32)
    torch.manual_seed(0)
    reference = MLP(27, dtype=torch.float32)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = _wrap(copy.deepcopy(reference), mesh, mp_policy=policy)
    out = model(batches[0][rank])
    assert out.dtype == torch.bfloat16 and model.w1.weight.dtype == torch.float32
    out.float().pow(2).mean().backward()
    assert model.w1.weight.grad.dtype == torch.float32
    # One process: the bf16 copy of the model computes each rank's batch, and the bf16
    # gradients are averaged in fp32.
    low = copy.deepcopy(reference).bfloat16()
    expected = {name: torch.zeros_like(q) for name, q in reference.named_parameters()}
    for x in batches[0]:
        low.zero_grad()
        low(x.bfloat16()).float().pow(2).mean().backward()
        for name, q in low.named_parameters():
            expected[name] += q.grad.float() / world_size
    for name, p in model.named_parameters():
        assert_close(p.grad.full_tensor(), expected[name], f"bf16 gradient of {name}", rtol=1e-5, atol=1e-6)

    # reduce_dtype None reduces in param_dtype, as FSDP2 does: the backward's reduce-scatters
    # (no gathers: reshard_after_forward off) send half the bytes of an fp32 reduction.
    sent = []
    for policy in (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
                   MixedPrecisionPolicy(param_dtype=torch.bfloat16)):
        model = _wrap(copy.deepcopy(reference), mesh, mp_policy=policy, reshard_after_forward=False)
        out = model(batches[0][rank])
        with st.CommDebugMode() as comms:
            out.float().pow(2).mean().backward()
        sent.append(comms.get_bytes())
    sent = torch.tensor(sent, dtype=torch.float64)
    torch.distributed.all_reduce(sent)
    elements = sum(p.numel() for p in reference.parameters())
    assert sent.tolist() == [(world_size - 1) * elements * 4, (world_size - 1) * elements * 2], sent.tolist()


@pytest.mark.parametrize("world_size", [2, 3])
def test_fsdp_mixed_precision(world_size):
    run_ranks(mixed_precision_body, world_size)


def accumulation_body(rank, world_size):
    """set_requires_gradient_sync(False) for the first micro-batch: no reduce-scatter, and the
    second backward's reduced gradient is that of both micro-batches; unshard() and reshard()."""
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
    batches = _batches(world_size)
    torch.manual_seed(0)
    reference = MLP(27)
    model = _wrap(copy.deepcopy(reference), mesh)
    model.set_requires_gradient_sync(False)
    with st.CommDebugMode() as comms:
        model(batches[0][rank]).pow(2).mean().backward()
    assert "reduce_scatter" not in comms.get_comm_counts(), comms.get_comm_counts()
    model.set_requires_gradient_sync(True)
    model(batches[1][rank]).pow(2).mean().backward()
    for chunks in batches[:2]:
        (sum(reference(x).pow(2).mean() for x in chunks) / world_size).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert_close(p.grad.full_tensor(), q.grad, f"accumulated gradient of {name}")

    model.unshard()
    assert not isinstance(model.w3.weight, st.ShardTensor)  # registered unsharded until reshard()
    with st.CommDebugMode() as comms:
        model.w3(torch.ones(2, 6, dtype=torch.float64))
    assert comms.get_total_counts() == 0, comms.table()
    model.reshard()
    assert isinstance(model.w3.weight, st.ShardTensor)


@pytest.mark.parametrize("world_size", [2, 3])
def test_fsdp_gradient_accumulation_and_explicit_unshard(world_size):
    run_ranks(accumulation_body, world_size)


def bad_input_body(rank, world_size):
    import shardtensor as st
    from shardtensor.fsdp import CPUOffloadPolicy, fully_shard
    from shardtensor.parallel import ColwiseParallel, parallelize_module

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = fully_shard(MLP(), mesh=mesh["dp"])
    with pytest.raises(ValueError, match="already fully sharded"):
        fully_shard(model, mesh=mesh["dp"])
    with pytest.raises(ValueError, match="does not include this rank"):
        fully_shard(MLP(), mesh=st.DeviceMesh("cpu", [0, 1]) if rank >= 2 else st.DeviceMesh("cpu", [2, 3]))
    on_dp = parallelize_module(MLP(), mesh["dp"], {"w1": ColwiseParallel()})
    with pytest.raises(ValueError, match="'w1.weight' is already laid out over the data-parallel mesh dims"):
        fully_shard(on_dp, mesh=mesh["dp"])
    other = st.init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    on_other = parallelize_module(MLP(), other, {"w1": ColwiseParallel()})
    with pytest.raises(ValueError, match="'w1.weight' is a ShardTensor on .* not a dim of the same mesh"):
        fully_shard(on_other, mesh=mesh["dp"])
    scalar = nn.Module()
    scalar.gain = nn.Parameter(torch.tensor(2.0))
    with pytest.raises(ValueError, match="'gain' is a scalar"):
        fully_shard(scalar, mesh=mesh["dp"])
    with pytest.raises(NotImplementedError, match="CPUOffloadPolicy"):
        fully_shard(MLP(), mesh=mesh["dp"], offload_policy=CPUOffloadPolicy())
    with pytest.raises(ValueError, match="pass the data-parallel mesh"):
        fully_shard(MLP())

    # torch's FSDP2 on ShardTensor parameters: at once, naming the parameter and the call to use.
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    tp_model = parallelize_module(MLP(), mesh["tp"], {"w1": ColwiseParallel()})
    with pytest.raises(TypeError, match="'w1.weight' is a ShardTensor.*shardtensor.fsdp.fully_shard"):
        torch_fully_shard(tp_model, mesh=mesh["dp"])
    with pytest.raises(TypeError, match="DistributedDataParallel: parameter 'w1.weight' is a ShardTensor.*fully_shard"):
        torch.nn.parallel.DistributedDataParallel(tp_model, process_group=mesh["dp"].get_group())


def test_fsdp_bad_input_is_a_clear_error_on_every_rank():
    run_ranks(bad_input_body, 4)


def training_script_body(rank, world_size, device_type="cpu", dtype=torch.bfloat16, steps=3):
    """A training script's step on a ("dp", "tp") mesh: tensor parallelism, fully_shard over "dp",
    autocast, GradScaler and fused AdamW; parameters after `steps` steps against one process
    running the same recipe on the dp ranks' batches. On CPU at 2x2 here; tests/python/test_cuda.py
    runs it on CUDA (fp16 and bf16) where a GPU is lent."""
    import shardtensor as st
    from shardtensor.fsdp import fully_shard
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dp_size = 2 if world_size % 2 == 0 else 1
    mesh = st.init_device_mesh(device_type, (dp_size, world_size // dp_size), mesh_dim_names=("dp", "tp"))
    device = torch.device("cuda", rank % torch.cuda.device_count()) if device_type == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    reference = MLP(27, dtype=torch.float32).to(device)
    model = parallelize_module(copy.deepcopy(reference), mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    fully_shard(model.w1, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    reference_opt = torch.optim.AdamW(reference.parameters(), lr=0.01, fused=True)
    scaler, reference_scaler = torch.amp.GradScaler(device_type), torch.amp.GradScaler(device_type)
    dp_rank = mesh.get_coordinate()[0]
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        chunks = torch.randn(dp_size * 4 + 1, 8, generator=g).to(device).tensor_split(dp_size)
        with torch.autocast(device_type, dtype=dtype):
            loss = model(chunks[dp_rank]).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        with torch.autocast(device_type, dtype=dtype):
            reference_loss = sum(reference(x).float().pow(2).mean() for x in chunks) / dp_size
        reference_scaler.scale(reference_loss).backward()
        reference_scaler.step(reference_opt)
        reference_scaler.update()
        reference_opt.zero_grad()
        assert scaler.get_scale() == reference_scaler.get_scale(), f"step {step}: the scale differs"
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert_close(p.full_tensor(), q.detach(), f"{device_type} {dtype} training step: {name}", rtol=1e-3, atol=2e-3)


def test_training_script_step_with_autocast_gradscaler_and_fused_adamw():
    run_ranks(training_script_body, 4)


def llama_body(rank, world_size, config):
    """torchtitan's llama plan (embedding, RMSNorm, grouped-query attention with rotary
    positions, SwiGLU, loss_parallel; examples/llama_tensor_parallel.py) on "tp", fully_shard per
    layer and at the root on "dp", 2x2: parameters after 3 AdamW steps equal one process's."""
    from test_llama_block import CONFIGS, _example

    import shardtensor as st
    from shardtensor.fsdp import fully_shard
    from shardtensor.parallel import loss_parallel

    llama = _example()
    vocab, dim, heads, kv_heads, hidden, layers, seqlen = CONFIGS[config]
    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh.get_coordinate()[0]
    torch.manual_seed(0)
    single = llama.Llama(vocab, dim, heads, kv_heads, hidden, layers, seqlen).double()
    model = llama.parallelize(copy.deepcopy(single), mesh["tp"], heads % 2 == 0 and kv_heads % 2 == 0)
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    tokens, labels = torch.randint(0, vocab, (2, 2, seqlen)), torch.randint(0, vocab, (2, 2, seqlen))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    single_opt = torch.optim.AdamW(single.parameters(), lr=0.01)
    for step in range(3):
        with loss_parallel():
            F.cross_entropy(model(tokens[dp_rank]).flatten(0, 1), labels[dp_rank].flatten(0, 1)).backward()
        opt.step()
        opt.zero_grad()
        (sum(F.cross_entropy(single(t).flatten(0, 1), y.flatten(0, 1)) for t, y in zip(tokens, labels)) / 2).backward()
        single_opt.step()
        single_opt.zero_grad()
    for (name, p), q in zip(model.named_parameters(), single.parameters()):
        assert_close(p.full_tensor(), q.detach(), f"llama {config}, FSDP x TP: {name}", rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("config", ["even", "uneven"])
def test_llama_under_torchtitans_plan_with_fsdp(config):
    run_ranks(llama_body, 4, config, timeout=400)


def _compiled_setup(rank, world_size, tensor_parallel):
    import shardtensor as st
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if tensor_parallel:
        mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        dp_mesh, dp_rank = mesh["dp"], mesh.get_coordinate()[0]
    else:
        mesh = dp_mesh = st.init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
        dp_rank = rank
    batches = _batches(dp_mesh.size())
    torch.manual_seed(0)
    reference = MLP(27)
    model = copy.deepcopy(reference)
    if tensor_parallel:
        parallelize_module(model, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    _wrap(model, dp_mesh)
    return reference, model, batches, dp_rank


def compiled_body(rank, world_size, tensor_parallel):
    """torch.compile(fullgraph=True) of a fully sharded model, FSDP alone or FSDP x TP (2x2,
    uneven hidden 27), by Inductor: three AdamW steps give one process's parameters. The
    parameters' all-gathers and their gradients' reduce-scatters are traced with the rest
    (SimpleFSDP's form), so the whole step compiles without a graph break."""
    reference, model, batches, dp_rank = _compiled_setup(rank, world_size, tensor_parallel)
    expected = _one_process(copy.deepcopy(reference), batches, steps=3)
    _train(torch.compile(model, fullgraph=True), batches, dp_rank, steps=3)
    _assert_parameters(model, expected, f"compiled FSDP{' x TP' if tensor_parallel else ''}")


def graphs_body(rank, world_size, tensor_parallel):
    """What the compiled step's graphs hold: the forward graph gathers every managed parameter
    and the backward graph reduce-scatters every gradient, as operators of the graphs (peer
    memory's exchanges, or torch's functional collectives), and the values are one process's;
    the eager hooks do not run. Where the traced form would not mean what the hooks do
    (gradient sync off), the compiled step runs the hooks eagerly and still gives one process's
    gradients."""
    from torch._dynamo.backends.common import aot_autograd

    import shardtensor as st

    torch._dynamo.reset()
    reference, model, batches, dp_rank = _compiled_setup(rank, world_size, tensor_parallel)
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def moves(graph):
        calls = [str(n.args[1] if n.target is torch.ops.higher_order.with_effects else n.target)
                 for n in graph.graph.nodes if n.op == "call_function"]
        return [c for c in calls if c.startswith(("shardtensor.exchange_parts", "shardtensor.all_reduce_parts", "_c10d_functional."))
                and not c.startswith("_c10d_functional.wait_tensor")]

    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
    expected = _one_process(copy.deepcopy(reference), batches, steps=2)
    _train(compiled, batches, dp_rank, steps=2)
    _assert_parameters(model, expected, "FSDP gathered in the graph")
    forward, backward = graphs[0], graphs[1]
    managed = sum(1 for _ in model.parameters())  # 6: every weight and bias
    if world_size > 1:
        # One gather per managed parameter in the forward (a tensor-parallel all-reduce besides,
        # under TP), one reduce-scatter per gradient in the backward: none runs outside them.
        assert len(moves(forward)) >= managed, moves(forward)
        assert len(moves(backward)) >= managed, moves(backward)
    assert len(graphs) == 2, f"the step compiled into {len(graphs)} graphs, expected one forward and one backward"
    assert isinstance(model.w1.weight, st.ShardTensor), "between steps a managed attribute is the sharded parameter"

    # Gradient accumulation (sync off) does not take the traced form: the hooks run eagerly,
    # between graphs (so not under fullgraph=True).
    compiled = torch.compile(model, backend="aot_eager")
    model.zero_grad()
    model.set_requires_gradient_sync(False)
    compiled(batches[0][dp_rank]).pow(2).mean().backward()
    model.set_requires_gradient_sync(True)
    compiled(batches[1][dp_rank]).pow(2).mean().backward()
    single = copy.deepcopy(expected)
    single.zero_grad()
    for step in range(2):
        chunks = batches[step]
        (sum(single(x).pow(2).mean() for x in chunks) / len(chunks)).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), single.named_parameters()):
        assert_close(p.grad.full_tensor(), q.grad, f"accumulated gradient of {name}")
    if not tensor_parallel:
        _eager_read_inside_a_traced_forward_raises(model._fsdp_state.params[0].mesh, batches[0][dp_rank])


@torch.compiler.disable
def _linear_eagerly(layer, x):
    return F.linear(x, layer.weight, layer.bias)


def _eager_read_inside_a_traced_forward_raises(mesh, x):
    """A forward whose graph breaks where it reads a managed parameter would run that code with
    the sharded parameter (the traced forward registered no unsharded one): it raises, naming
    the parameter, rather than compute something else than the model."""
    from shardtensor.fsdp import fully_shard

    class Breaks(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(8, 3, dtype=torch.float64)

        def forward(self, x):
            return _linear_eagerly(self.layer, x)

    model = fully_shard(Breaks(), mesh=mesh)
    with pytest.raises(RuntimeError, match=r"layer\.weight.*read outside the graph of a compiled forward"):
        torch.compile(model, backend="aot_eager")(x)
    assert model(x).shape == (x.shape[0], 3), "after the refusal, eager forwards run as before"


@pytest.mark.parametrize("tensor_parallel", [False, True], ids=["fsdp", "fsdp_x_tp"])
def test_fsdp_gathers_are_in_the_compiled_graphs(tensor_parallel):
    run_ranks(graphs_body, 4 if tensor_parallel else 2, tensor_parallel)


@pytest.mark.parametrize("tensor_parallel", [False, True], ids=["fsdp", "fsdp_x_tp"])
def test_fsdp_under_torch_compile(tensor_parallel):
    run_ranks(compiled_body, 4 if tensor_parallel else 2, tensor_parallel)
