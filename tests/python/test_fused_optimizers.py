"""Issue 76: torch's fused optimizers (fused=True) and GradScaler on ShardTensor parameters.

- AdamW, Adam (amsgrad too), SGD with momentum and Adagrad with fused=True, float and tensor
  learning rates, on a tensor-parallel MLP (Colwise / Rowwise, uneven) with a plain parameter
  beside the ShardTensors: parameters after 3 steps equal one process's fused run;
  optimizer.state_dict() / load_state_dict() round trip and the run goes on alike;
- GradScaler: unscale, the inf check and the scale update; an inf in one rank's piece of one
  gradient skips the step on every rank, and the scale backs off everywhere alike;
- a state laid out unlike its parameter is a clear error on every rank, naming the parameter.
World sizes 1-4.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from oracle import assert_close
from ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4]


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(8, 13)
        self.w2 = nn.Linear(13, 8)
        self.scale = nn.Parameter(torch.ones(8))  # stays plain beside the ShardTensors

    def forward(self, x):
        return self.w2(F.relu(self.w1(x))) * self.scale


OPTIMIZERS = [
    ("AdamW", lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, fused=True)),
    ("AdamW tensor lr", lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(0.05), fused=True)),
    ("Adam amsgrad", lambda ps: torch.optim.Adam(ps, lr=0.05, amsgrad=True, fused=True)),
    ("SGD momentum", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True)),
    ("Adagrad", lambda ps: torch.optim.Adagrad(ps, lr=0.1, fused=True)),
]


def _whole(t):
    import shardtensor as st

    return t.full_tensor() if isinstance(t, st.ShardTensor) else t


def _models(mesh):
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    single = MLP().double()
    model = parallelize_module(copy.deepcopy(single), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    return single, model


def _step(model, opt, x):
    opt.zero_grad()
    model(x).square().sum().backward()
    opt.step()


def fused_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    x = torch.randn(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for name, make in OPTIMIZERS:
        single, model = _models(mesh)
        opt_single, opt = make(single.parameters()), make(model.parameters())
        for _ in range(2):
            _step(single, opt_single, x)
            _step(model, opt, x)
        # The state round-trips: a fresh optimizer loaded from it goes on as the first would.
        state = opt.state_dict()
        opt = make(model.parameters())
        opt.load_state_dict(state)
        _step(single, opt_single, x)
        _step(model, opt, x)
        for (pname, p), (_, q) in zip(single.named_parameters(), model.named_parameters()):
            assert_close(_whole(q.detach()), p.detach(), f"{name}: {pname} after 3 fused steps", rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_fused_optimizers_step_like_one_process(world_size):
    run_ranks(fused_body, world_size)


def scaler_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    x = torch.randn(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    single, model = _models(mesh)
    runs = []
    for m in (single, model):
        opt = torch.optim.AdamW(m.parameters(), lr=0.05, fused=True)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
        runs.append((m, opt, scaler))
    for step in range(3):
        for m, opt, scaler in runs:
            opt.zero_grad()
            scaler.scale(m(x).square().sum()).backward()
            if step == 1:
                # An inf in the last rank's piece of w1's gradient (the last row): every rank skips.
                with torch.no_grad():
                    g = m.w1.weight.grad
                    if isinstance(g, st.ShardTensor):
                        local = g.to_local()
                        if rank == world_size - 1 and local.shape[0]:
                            local[-1, 0] = float("inf")
                    else:
                        g[-1, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
        assert runs[0][2].get_scale() == runs[1][2].get_scale(), (step, runs[0][2].get_scale(), runs[1][2].get_scale())
        for (pname, p), (_, q) in zip(single.named_parameters(), model.named_parameters()):
            assert_close(_whole(q.detach()), p.detach(), f"GradScaler step {step}: {pname}", rtol=1e-9, atol=1e-11)
    assert runs[1][2].get_scale() == 1024.0 * 2 * 0.5 * 2, runs[1][2].get_scale()  # grew, backed off, grew


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_grad_scaler_skips_a_step_on_every_rank_when_one_piece_overflows(world_size):
    run_ranks(scaler_body, world_size)


def bad_state_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    p = nn.Parameter(st.distribute_tensor(torch.ones(6, 4), mesh, [st.Shard(0)]))
    p.grad = st.distribute_tensor(torch.ones(6, 4), mesh, [st.Shard(0)])
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    opt.step()
    opt.state[p]["exp_avg"] = st.distribute_tensor(torch.zeros(6, 4), mesh, [st.Shard(1)])
    with pytest.raises(RuntimeError, match=r"parameter 0 is laid out as .* but its 'exp_avgs' as"):
        opt.step()


def test_a_state_laid_out_unlike_its_parameter_is_an_error_on_every_rank():
    run_ranks(bad_state_body, 3)
