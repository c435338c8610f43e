"""The models both torch.compile test files compile (test_compile.py: ShardTensors behind graph
breaks; test_compile_traced.py: traced), each compared, values and gradients, with the same
model on one process. `compile(model, backend, dynamic=None)` is the file's torch.compile call."""

import copy
import importlib.util
import os

import torch
import torch.nn.functional as F
from torch import nn

from oracle import assert_close

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = dict(rtol=1e-9, atol=1e-11)


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_gradients(model, single, what):
    import shardtensor as st

    for (name, p), q in zip(model.named_parameters(), single.parameters()):
        grad = p.grad.full_tensor() if st.is_shard_tensor(p.grad) else p.grad
        assert_close(grad, q.grad, f"{what}: gradient of {name}", **TOL)


class MLP(nn.Module):
    def __init__(self, dim=16, hidden=30):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


def tp_mlp(mesh, backend, compile):
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    hidden = 3 if mesh.size() == 4 else 30  # an empty piece at 4 ranks, uneven ones at 3
    single = MLP(16, hidden).double()
    model = parallelize_module(copy.deepcopy(single), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    compiled = compile(model, backend)
    x, y = torch.randn(13, 16, dtype=torch.float64), torch.randn(13, 16, dtype=torch.float64)
    for step in range(2):  # the second call runs what the first compiled
        model.zero_grad()
        single.zero_grad()
        out = compiled(x)
        F.mse_loss(out, y).backward()
        expected = single(x)
        F.mse_loss(expected, y).backward()
        what = f"TP-MLP, {backend}, call {step}"
        assert_close(out, expected.detach(), f"{what}: output", **TOL)
        check_gradients(model, single, what)


def llama_block(mesh, backend, compile):
    """torchtitan's llama plan (RowwiseParallel embedding, SequenceParallel norms, colwise and
    rowwise projections, loss_parallel) on a 3-head, 1-key/value-head model: at 3 ranks the key
    and value heads split 1, 0, 0. The sequence-parallel norms take their input as a plain
    tensor and rebuild its layout with from_local(sharding_shapes="infer"): the graph holds the
    sizes gathered when it was traced, and a check that gathers them again each run."""
    import shardtensor as st
    from shardtensor.parallel import loss_parallel

    llama = load_example("llama_tensor_parallel")
    world = mesh.size()
    vocab, dim, heads, kv_heads, hidden, layers, seqlen = 37, 12, 3, 1, 22, 1, 13
    torch.manual_seed(0)
    single = llama.Llama(vocab, dim, heads, kv_heads, hidden, layers, seqlen).double()
    model = llama.parallelize(copy.deepcopy(single), mesh, heads % world == 0 and kv_heads % world == 0)
    # dynamic=False: automatic dynamic shapes would make the styles' sizes symbolic on a recompile.
    compiled = compile(model, backend, dynamic=False)
    tokens, labels = torch.randint(0, vocab, (2, seqlen)), torch.randint(0, vocab, (2, seqlen))
    pred = compiled(tokens)
    with loss_parallel():
        loss = F.cross_entropy(pred.flatten(0, 1), labels.flatten(0, 1))
        loss.backward()
    expected = F.cross_entropy(single(tokens).flatten(0, 1), labels.flatten(0, 1))
    expected.backward()
    assert_close(loss.full_tensor() if st.is_shard_tensor(loss) else loss, expected.detach(),
                 f"llama, {backend}: loss", **TOL)
    check_gradients(model, single, f"llama, {backend}")


def unet(mesh, backend, compile):
    import shardtensor as st

    demo = load_example("heat_unet_demo")
    torch.manual_seed(11)
    single = demo.UNet().double()
    model = demo.replicate_module(copy.deepcopy(single), mesh)
    compiled = compile(model, backend)
    height = 6 * mesh.size() + 4  # even pieces (the pooling windows), unequal ones
    sizes = [2 * (3 + (r % 2)) for r in range(mesh.size() - 1)]
    sizes.append(height - sum(sizes))
    u, target = torch.randn(2, 1, height, 10, dtype=torch.float64), torch.randn(2, 1, height, 10, dtype=torch.float64)
    su = st.distribute_tensor(u, mesh, [st.Shard(2)], sharding_shapes={2: sizes})
    starget = st.distribute_tensor(target, mesh, [st.Shard(2)], sharding_shapes={2: sizes})
    loss = F.mse_loss(compiled(su), starget)
    loss.backward()
    expected = F.mse_loss(single(u), target)
    expected.backward()
    assert_close(loss.full_tensor(), expected.detach(), f"U-Net, {backend}: loss", **TOL)
    check_gradients(model, single, f"U-Net, {backend}")
