"""A llama model (token embedding, RMSNorm, attention with grouped-query heads and rotary
positions, SwiGLU feed-forward, output projection, cross-entropy) under torchtitan's classic
tensor-parallel plan with SequenceParallel and loss_parallel (examples/llama_tensor_parallel.py),
against the same model on one process: the loss and every parameter's gradient, then two SGD
steps. On sizes the mesh divides, and on sizes it does not (a sequence of 13, a vocabulary of 37,
a feed-forward width of 22, 3 heads), with empty pieces at 4 ranks; and the example itself."""

import copy
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from oracle import assert_close
from ranks import run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "llama_tensor_parallel.py")
TOL = dict(rtol=1e-9, atol=1e-11)
CONFIGS = {
    # vocab, dim, heads, kv heads, ffn width, layers, sequence
    "even": (32, 16, 4, 2, 32, 2, 8),
    "uneven": (37, 12, 3, 1, 22, 2, 13),
}


def _example():
    spec = importlib.util.spec_from_file_location("llama_tensor_parallel", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def llama_body(rank, world_size, config):
    import shardtensor as st
    from shardtensor.parallel import loss_parallel

    llama = _example()
    vocab, dim, heads, kv_heads, hidden, layers, seqlen = CONFIGS[config]
    # torchtitan's local head views need whole heads on every rank.
    local_heads = heads % world_size == 0 and kv_heads % world_size == 0
    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    single = llama.Llama(vocab, dim, heads, kv_heads, hidden, layers, seqlen).double()
    model = llama.parallelize(copy.deepcopy(single), mesh, local_heads)
    tokens = torch.randint(0, vocab, (2, seqlen))
    labels = torch.randint(0, vocab, (2, seqlen))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1)
    for step in range(2):
        what = f"{config} sizes, {world_size} ranks, step {step}"
        opt.zero_grad()
        single_opt.zero_grad()
        pred = model(tokens)
        with loss_parallel():
            loss = F.cross_entropy(pred.flatten(0, 1), labels.flatten(0, 1))
            loss.backward()
        expected = F.cross_entropy(single(tokens).flatten(0, 1), labels.flatten(0, 1))
        expected.backward()
        assert_close(loss.full_tensor(), expected.detach(), f"{what}: loss", **TOL)
        for (name, p), q in zip(model.named_parameters(), single.parameters()):
            grad = p.grad.full_tensor() if st.is_shard_tensor(p.grad) else p.grad
            assert_close(grad, q.grad, f"{what}: gradient of {name}", **TOL)
        opt.step()
        single_opt.step()
    for (name, p), q in zip(model.named_parameters(), single.parameters()):
        assert_close(p.detach().full_tensor(), q.detach(), f"{config}: {name} after two steps", **TOL)


def all_bodies(rank, world_size):
    for config in CONFIGS:
        llama_body(rank, world_size, config)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_llama_under_torchtitans_plan_matches_one_process(world_size):
    run_ranks(all_bodies, world_size, timeout=400)


def test_the_example_runs_on_three_ranks():
    shardrun = os.path.join(os.path.dirname(sys.executable), "shardrun")
    env = dict(os.environ, SHARDTENSOR_TIMEOUT_S="60", SHARDTENSOR_STRICT="1")
    result = subprocess.run([shardrun, "-n", "3", sys.executable, EXAMPLE], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "largest relative difference" in result.stdout, result.stdout[-2000:]
