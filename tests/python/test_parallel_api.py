"""DTensor's module API (shardtensor.parallel): parallelize_module and its styles,
distribute_module and loss_parallel, on sizes the mesh does not divide (empty pieces included).
Every value and gradient is compared with the same model on one process, on every rank."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from oracle import assert_close, chunk_sizes
from ranks import run_ranks

TOL = dict(rtol=1e-9, atol=1e-12)


def _counts(comm) -> dict:
    return {kind: n for kind, n in comm.get_comm_counts().items() if n}


class MLP(nn.Module):
    """DTensor's tutorial MLP: w1, relu, w2."""

    def __init__(self, dim=16, hidden=30):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


def _check_mlp(mesh, hidden, expected_forward, what):
    """Colwise w1 / Rowwise w2 on `mesh`, three SGD steps against one process."""
    import shardtensor as st
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    single = MLP(16, hidden).double()
    model = parallelize_module(copy.deepcopy(single), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    sizes = chunk_sizes(hidden, mesh.size())
    assert model.w1.weight.placements == (st.Shard(0),) and model.w1.weight.shard_sizes() == {0: sizes}
    assert model.w1.bias.placements == (st.Shard(0),) and model.w1.bias.shard_sizes() == {0: sizes}
    assert model.w2.weight.placements == (st.Shard(1),) and model.w2.weight.shard_sizes() == {1: sizes}
    assert model.w2.bias.placements == (st.Replicate(),)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_single = torch.optim.SGD(single.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)  # the same batches on every rank
    for step in range(3):
        x = torch.randn(13, 16, dtype=torch.float64, generator=data)
        y = torch.randn(13, 16, dtype=torch.float64, generator=data)
        outs = []
        for m, o in ((model, opt), (single, opt_single)):
            o.zero_grad()
            out = m(x)
            F.mse_loss(out, y).backward()
            o.step()
            outs.append(out)
        assert not st.is_shard_tensor(outs[0]), "RowwiseParallel's output is local (use_local_output=True)"
        assert_close(outs[0], outs[1].detach(), f"{what}: output at step {step}", **TOL)
        for (name, p), q in zip(model.named_parameters(), single.parameters()):
            assert_close(p.grad.full_tensor(), q.grad, f"{what}: gradient of {name} at step {step}", **TOL)
            assert_close(p.full_tensor(), q.detach(), f"{what}: {name} after step {step}", **TOL)
    with st.CommDebugMode() as comm:
        out = model(x)
        forward = _counts(comm)
        F.mse_loss(out, y).backward()
        total = _counts(comm)
    assert forward == expected_forward, f"{what}: one forward made {forward}, expected {expected_forward}"
    assert total == forward, f"{what}: the backward communicated ({total} in all, {forward} in the forward)"


def mlp_body(rank, world_size, hiddens):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    # The hand-written minimum: RowwiseParallel's all-reduce. Its local input's sizes are its
    # weight's pieces, the same on every rank by construction, so from_local needs no agreement
    # all-gather there.
    expected = {} if world_size == 1 else {"all_reduce": 1}
    for hidden in hiddens:
        _check_mlp(mesh, hidden, expected, f"hidden {hidden} over {world_size} ranks")
    assert st.fallback_operators() == [], st.fallback_operators()


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_colwise_rowwise_mlp_matches_one_process(world_size):
    run_ranks(mlp_body, world_size, [30])


def four_ranks_body(rank, world_size):
    import shardtensor as st
    from shardtensor.parallel import ColwiseParallel, parallelize_module

    mesh = st.init_device_mesh("cpu", (4,))
    expected = {"all_reduce": 1}
    _check_mlp(mesh, 30, expected, "hidden 30 over 4 ranks (8, 8, 8, 6)")
    _check_mlp(mesh, 3, expected, "hidden 3 over 4 ranks (1, 1, 1, 0)")

    # A 2x2 mesh: tensor parallelism along "tp"; each "dp" row trains on its own batch.
    mesh2 = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    with pytest.raises(ValueError, match=r'mesh\["tp"\]'):
        parallelize_module(MLP(), mesh2, {"w1": ColwiseParallel()})
    dp = mesh2.get_coordinate()[0]
    _check_tp_submesh(mesh2["tp"], dp)
    assert st.fallback_operators() == [], st.fallback_operators()


def _check_tp_submesh(tp, dp):
    import shardtensor as st
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    single = MLP(16, 7).double()
    model = parallelize_module(copy.deepcopy(single), tp, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    assert model.w1.weight.device_mesh == tp and model.w1.weight.shard_sizes() == {0: [4, 3]}
    data = torch.Generator().manual_seed(10 + dp)
    x = torch.randn(5, 16, dtype=torch.float64, generator=data)
    with st.CommDebugMode() as comm:
        out = model(x)
    assert _counts(comm) == {"all_reduce": 1}, _counts(comm)
    ref = single(x)
    assert_close(out, ref.detach(), f"dp {dp}: output on mesh['tp']", **TOL)
    out.pow(2).sum().backward()
    ref.pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), single.parameters()):
        assert_close(p.grad.full_tensor(), q.grad, f"dp {dp}: gradient of {name} on mesh['tp']", **TOL)


def test_mlp_on_four_ranks_with_an_empty_piece_and_a_tp_sub_mesh():
    run_ranks(four_ranks_body, 4)


# ---- DTensor's tutorial, imports swapped -------------------------------------------------------

class ToyModel(nn.Module):
    """pytorch/examples distributed/tensor_parallelism/tensor_parallel_example.py"""

    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


def tutorial_body(rank, world_size):
    import os

    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from shardtensor import init_device_mesh

    # ---- the tutorial, as written (device "cpu", and a seed for the model) ----
    _world_size = int(os.environ["WORLD_SIZE"])
    device_mesh = init_device_mesh(device_type="cpu", mesh_shape=(_world_size,))
    torch.manual_seed(0)
    tp_model = ToyModel()
    single = copy.deepcopy(tp_model)  # the oracle: the same model on one process
    tp_model = parallelize_module(
        module=tp_model,
        device_mesh=device_mesh,
        parallelize_plan={
            "in_proj": ColwiseParallel(),
            "out_proj": RowwiseParallel(),
        },
    )
    lr = 0.25
    optimizer = torch.optim.AdamW(tp_model.parameters(), lr=lr, foreach=True)
    num_iters = 10
    optimizer_single = torch.optim.AdamW(single.parameters(), lr=lr, foreach=True)
    for i in range(num_iters):
        # For TP, input needs to be same across all TP ranks.
        # Setting the random seed is to mimic the behavior of dataloader.
        torch.manual_seed(i)
        inp = torch.rand(20, 10)
        output = tp_model(inp)
        output.sum().backward()
        optimizer.step()
        # ---- the oracle ----
        expected = single(inp)
        expected.sum().backward()
        optimizer_single.step()
        assert_close(output, expected.detach(), f"tutorial output at iteration {i}", rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(tp_model.named_parameters(), single.parameters()):
        assert_close(p.full_tensor(), q.detach(), f"tutorial: {name} after {num_iters} iterations",
                     rtol=1e-5, atol=1e-5)
    assert tp_model.in_proj.weight.shard_sizes() == {0: chunk_sizes(32, world_size)}


@pytest.mark.parametrize("world_size", [3])
def test_dtensor_tutorial_script_with_only_the_imports_swapped(world_size):
    run_ranks(tutorial_body, world_size)  # 32 hidden units over 3 ranks: 11, 11, 10


# ---- sequence parallelism on a sequence of 13 --------------------------------------------------

class Block(nn.Module):
    def __init__(self, dim=8, hidden=12):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.w2(F.gelu(self.w1(self.norm(x))))


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x)


def sequence_parallel_body(rank, world_size):
    import shardtensor as st
    from shardtensor import Replicate, Shard
    from shardtensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput, RowwiseParallel,
                                      SequenceParallel, parallelize_module)

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    single = Outer().double()
    with torch.no_grad():  # not LayerNorm's ones and zeros, so that their gradients say something
        single.block.norm.weight.uniform_(0.5, 1.5)
        single.block.norm.bias.uniform_(-0.5, 0.5)
    model = parallelize_module(copy.deepcopy(single), mesh, {
        "block": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1)),
        "block.norm": SequenceParallel(),
        "block.w1": ColwiseParallel(input_layouts=Shard(1)),                          # all-gathers the sequence
        "block.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),  # reduce-scatters it
        "": PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate()),
    })
    assert model.block.norm.weight.placements == (Replicate(),)
    # What the norm and the residual see: the sequence split 4, 4, 4, 1 over 4 ranks.
    seen = {}
    model.block.norm.register_forward_hook(lambda m, i, o: seen.update(norm=o) and None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_single = torch.optim.SGD(single.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    for step in range(3):
        x = torch.randn(2, 13, 8, dtype=torch.float64, generator=data)
        xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        opt.zero_grad()
        opt_single.zero_grad()
        with st.CommDebugMode() as comm:
            out = model(xs)
            forward = _counts(comm)
            out.pow(2).sum().backward()
            total = _counts(comm)
        ref = single(xr)
        ref.pow(2).sum().backward()
        assert not st.is_shard_tensor(out)
        assert_close(out, ref.detach(), f"sequence parallel: output at step {step}", **TOL)
        assert_close(xs.grad, xr.grad, f"sequence parallel: input gradient at step {step}", **TOL)
        for (name, p), q in zip(model.named_parameters(), single.parameters()):
            assert_close(p.grad.full_tensor(), q.grad, f"sequence parallel: gradient of {name} at step {step}", **TOL)
        opt.step()
        opt_single.step()
        for (name, p), q in zip(model.named_parameters(), single.parameters()):
            assert_close(p.full_tensor(), q.detach(), f"sequence parallel: {name} after step {step}", **TOL)
    norm_out = seen["norm"]
    assert norm_out.placements == (Shard(1),) and norm_out.shard_sizes() == {1: chunk_sizes(13, world_size)}
    # Forward: w1's all-gather of the sequence, w2's reduce-scatter, the output's all-gather, and
    # the from_local agreement check of the input, which requires grad (w2's local input has its
    # weight's sizes: no check). Backward: the reduce-scatter of w1's all-gather, the all-gather
    # of w2's reduce-scatter and the input's gradient from Shard(1) back to Replicate.
    assert forward == {"all_gather": 3, "reduce_scatter": 1}, forward
    assert total == {"all_gather": 5, "reduce_scatter": 2}, total
    assert st.fallback_operators() == [], st.fallback_operators()


def test_sequence_parallel_on_a_sequence_the_mesh_does_not_divide():
    run_ranks(sequence_parallel_body, 4)


# ---- vocabulary-split embedding and loss_parallel ----------------------------------------------

class TinyLM(nn.Module):
    def __init__(self, vocab, dim, classes):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, classes)

    def forward(self, tokens):
        return self.proj(torch.tanh(self.tok(tokens)))


LOSS_VARIANTS = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(label_smoothing=0.1),
                 dict(weight=True), dict(weight=True, label_smoothing=0.2, reduction="none"),
                 dict(weight=True, ignore_index=2, reduction="sum")]


def loss_parallel_body(rank, world_size):
    import shardtensor as st
    from shardtensor import Replicate, Shard
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module

    mesh = st.init_device_mesh("cpu", (world_size,))
    for classes in (7, 3):  # 2, 2, 2, 1 and 1, 1, 1, 0 classes per rank
        torch.manual_seed(0)
        single = TinyLM(10, 6, classes).double()
        model = parallelize_module(copy.deepcopy(single), mesh, {
            "tok": RowwiseParallel(input_layouts=Replicate()),  # the vocabulary of 10: 3, 3, 3, 1 rows
            "proj": ColwiseParallel(use_local_output=False),
        })
        assert model.tok.weight.placements == (Shard(0),) and model.tok.weight.shard_sizes() == {0: [3, 3, 3, 1]}
        tokens = torch.randint(0, 10, (3, 5))
        target = torch.randint(0, classes, (3, 5))
        target[0, 1] = -100
        class_weight = torch.rand(classes, dtype=torch.float64) + 0.5
        for variant in LOSS_VARIANTS:
            kw = dict(variant, weight=class_weight) if variant.get("weight") else dict(variant)
            tgt = target.clamp(min=0) if kw.get("ignore_index") == 2 else target
            what = f"{classes} classes, cross_entropy({kw})"
            model.zero_grad()
            single.zero_grad()
            with st.CommDebugMode() as comm:
                logits = model(tokens)
                before = _counts(comm)
                with loss_parallel():
                    loss = F.cross_entropy(logits.transpose(1, 2), tgt, **kw)
                after = _counts(comm)
                loss.sum().backward()
                total = _counts(comm)
            ref = F.cross_entropy(single(tokens).transpose(1, 2), tgt, **kw)
            ref.sum().backward()
            assert logits.placements == (Shard(2),) and loss.placements == (Replicate(),)
            assert_close(loss.full_tensor(), ref.detach(), what, **TOL)
            for (name, p), q in zip(model.named_parameters(), single.parameters()):
                assert_close(p.grad.full_tensor(), q.grad, f"{what}: gradient of {name}", **TOL)
            # The embedding's all-reduce; ColwiseParallel's from_local check of its input (it
            # requires grad). The loss: the max and the sums, one all-reduce each (with an
            # empty piece the max is wrapped with from_local: one small check more).
            assert before == {"all_reduce": 1, "all_gather": 1}, (what, before)
            loss_comm = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
            assert loss_comm == ({"all_reduce": 2} if classes == 7 else {"all_reduce": 2, "all_gather": 1}), \
                (what, loss_comm)
            # Backward: the gradient of ColwiseParallel's replicated input, a pending sum.
            assert total == {"all_reduce": after["all_reduce"] + 1, "all_gather": after["all_gather"]}, (what, total)

        # The flattened form, and nn.CrossEntropyLoss, inside; the gathering of the logits outside.
        with loss_parallel():
            flat = nn.CrossEntropyLoss()(model(tokens).flatten(0, 1), target.flatten())
        assert_close(flat.full_tensor(), F.cross_entropy(single(tokens).flatten(0, 1), target.flatten()).detach(),
                     f"{classes} classes: nn.CrossEntropyLoss, flattened", **TOL)
    logits = model(tokens).flatten(0, 1)
    flat_target = st.distribute_tensor(target.flatten(), mesh, [Replicate()])
    with st.CommDebugMode() as comm:
        with st.strict(False), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            F.cross_entropy(logits, flat_target)
    assert comm.get_comm_counts().get("all_gather", 0) >= 1, "outside loss_parallel the logits are gathered"

    # What loss_parallel refuses, on every rank.
    with loss_parallel():
        partial = st.from_local(torch.zeros(15, 3, dtype=torch.float64), mesh, [st.Partial()])
        with pytest.raises(ValueError, match="Shard or Replicate"):
            F.cross_entropy(partial, target.flatten())
        with pytest.raises(NotImplementedError, match="class probabilities"):
            F.cross_entropy(logits, torch.rand(15, 3, dtype=torch.float64))
        by_rows = st.distribute_tensor(torch.randn(15, 3, dtype=torch.float64), mesh, [Shard(0)])
        with pytest.raises(ValueError, match="must be a ShardTensor"):
            F.cross_entropy(by_rows, target.flatten())
    # A batch split is fine when the target is laid out with it.
    g = torch.randn(15, 3, dtype=torch.float64)
    by_rows = st.distribute_tensor(g, mesh, [Shard(0)])
    with loss_parallel():
        loss = F.cross_entropy(by_rows, st.distribute_tensor(target.flatten(), mesh, [Replicate()]))
    assert_close(loss.full_tensor(), F.cross_entropy(g, target.flatten()), "rows split, target replicated", **TOL)


def test_embedding_rowwise_and_loss_parallel_match_one_process():
    run_ranks(loss_parallel_body, 4)


# ---- distribute_module --------------------------------------------------------------------------

class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 7)
        self.b = nn.Linear(7, 3)
        self.register_buffer("scale", torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) * self.scale


def distribute_module_body(rank, world_size):
    import shardtensor as st
    from shardtensor import Replicate, Shard
    from shardtensor.parallel import distribute_module

    assert st.distribute_module is distribute_module
    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    single = TwoLayers().double()
    calls = []

    def partition_fn(name, module, device_mesh):
        calls.append(name)
        if name == "a":
            module.register_parameter("weight", nn.Parameter(st.distribute_tensor(module.weight.detach(), device_mesh,
                                                                                  [Shard(0)])))

    def input_fn(module, inputs, device_mesh):
        return tuple(st.distribute_tensor(x, device_mesh, [Replicate()], src_data_rank=None) for x in inputs)

    def output_fn(module, outputs, device_mesh):
        return outputs.redistribute(device_mesh, [Replicate()]).to_local()

    model = distribute_module(copy.deepcopy(single), mesh, partition_fn, input_fn, output_fn)
    assert calls == ["", "a", "b"]
    assert model.a.weight.placements == (Shard(0),) and model.a.weight.shard_sizes() == {0: chunk_sizes(7, world_size)}
    for name, p in [("a.bias", model.a.bias), ("b.weight", model.b.weight), ("b.bias", model.b.bias)]:
        assert isinstance(p, nn.Parameter) and p.placements == (Replicate(),), name
    assert st.is_shard_tensor(model.scale) and model.scale.placements == (Replicate(),)
    x = torch.randn(4, 5, dtype=torch.float64)
    out, ref = model(x), single(x)
    assert not st.is_shard_tensor(out)
    assert_close(out, ref.detach(), "distribute_module: output", **TOL)
    out.sum().backward()
    ref.sum().backward()
    for (name, p), q in zip(model.named_parameters(), single.parameters()):
        assert_close(p.grad.full_tensor(), q.grad, f"distribute_module: gradient of {name}", **TOL)
    with pytest.raises(RuntimeError, match="only be called once"):
        distribute_module(model, mesh)

    # Without partition_fn every parameter and buffer is replicated; DTensor's deprecated
    # two-argument hooks still work, with a FutureWarning.
    with pytest.warns(FutureWarning, match="deprecated"):
        plain = distribute_module(copy.deepcopy(single), mesh, input_fn=lambda inputs, m: input_fn(None, inputs, m),
                                  output_fn=lambda outputs, m: outputs.full_tensor())
    assert all(p.placements == (Replicate(),) for p in plain.parameters())
    assert_close(plain(x), ref.detach(), "distribute_module without partition_fn", **TOL)
    with pytest.raises(ValueError, match="3 arguments"):
        distribute_module(TwoLayers(), mesh, input_fn=lambda a, b, c, d: a)
    assert st.fallback_operators() == [], st.fallback_operators()


def test_distribute_module_with_partition_input_and_output_functions():
    run_ranks(distribute_module_body, 3)  # 7 rows over 3 ranks: 3, 3, 1


# ---- plans: paths, wildcards and what is refused --------------------------------------------------

class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.Linear(4, 6)
        self.mlp = MLP(4, 5)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.conv = nn.Conv2d(1, 1, 1)


def plans_body(rank, world_size):
    import shardtensor as st
    from shardtensor import Replicate, Shard
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    mesh = st.init_device_mesh("cpu", (world_size,))
    model = parallelize_module(Stack(), mesh, {"layers.*.attention": ColwiseParallel(),
                                               "layers.0.mlp.w1": ColwiseParallel(),
                                               "layers.1.mlp.w2": RowwiseParallel()})
    for i in range(2):
        assert model.layers[i].attention.weight.placements == (Shard(0),)
    assert model.layers[0].mlp.w1.weight.placements == (Shard(0),)
    assert not st.is_shard_tensor(model.layers[1].mlp.w1.weight)
    assert model.layers[1].mlp.w2.weight.placements == (Shard(1),)
    assert model.layers[1].mlp.w2.bias.placements == (Replicate(),)

    # A key that matches nothing: DTensor warns and skips it, and so does shardtensor.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        untouched = parallelize_module(Stack(), mesh, {"layers.*.attn": ColwiseParallel(), "norm": SequenceParallel()})
    messages = [str(w.message) for w in caught]
    assert any("'layers.*.attn'" in m and "'attn'" in m for m in messages), messages
    assert any("'norm'" in m and "skipping" in m for m in messages), messages
    assert not any(st.is_shard_tensor(p) for p in untouched.parameters())
    # A style on a module it cannot split, a 2-D mesh and a plan of the wrong type raise.
    with pytest.raises(NotImplementedError, match=r"nn\.Linear and nn\.Embedding.*Conv2d"):
        parallelize_module(Stack(), mesh, {"conv": ColwiseParallel()})
    with pytest.raises(NotImplementedError, match=r"nn\.Linear and nn\.Embedding.*Conv2d"):
        parallelize_module(nn.Conv2d(1, 1, 1), mesh, RowwiseParallel())
    mesh2 = st.init_device_mesh("cpu", (world_size, 1), mesh_dim_names=("tp", "dp"))
    with pytest.raises(ValueError, match=r'1-D DeviceMesh.*mesh\["tp"\]'):
        parallelize_module(Stack(), mesh2, {"conv": ColwiseParallel()})
    with pytest.raises(TypeError, match="ParallelStyle or a dict"):
        parallelize_module(Stack(), mesh, [ColwiseParallel()])
    # The styles' arguments and defaults are DTensor's.
    assert repr(ColwiseParallel()) == ("ColwiseParallel(input_layouts=(Replicate(),), "
                                       "output_layouts=(Shard(dim=-1),), use_local_output=True)")
    assert RowwiseParallel().input_layouts == (Shard(-1),) and RowwiseParallel().output_layouts == (Replicate(),)
    assert SequenceParallel().sequence_sharding == (Shard(1),) and not SequenceParallel().use_local_output


def test_plans_match_paths_and_wildcards_and_refuse_bad_input():
    run_ranks(plans_body, 2)
