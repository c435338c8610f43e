"""The C++ log through Python's logging: TORCH_LOGS=+shardtensor shows each propagation miss with
its layouts and each redistribute plan, once (cached calls log nothing); without it, nothing;
SHARDTENSOR_LOG=1 shows one line per call."""

import logging

import pytest
import torch

from ranks import run_ranks


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelno, record.getMessage()))


def debug_body(rank, world_size, expect_debug):
    import shardtensor as st

    if expect_debug:  # the program's way; the environment's is test_torch_logs_environment_variable
        torch._logging.set_logs(modules={"shardtensor": logging.DEBUG})
    lines = Lines()
    logging.getLogger("shardtensor").addHandler(lines)
    mesh = st.init_device_mesh("cpu", (world_size,))
    x = st.distribute_tensor(torch.arange(12.0).reshape(6, 2), mesh, [st.Shard(0)])
    for _ in range(3):
        y = (x * 2).sum(0)
        y.redistribute(mesh, [st.Replicate()])
    misses = [m for lvl, m in lines.lines if m.startswith("propagation miss: aten::mul.Tensor")]
    plans = [m for lvl, m in lines.lines if m.startswith("redistribute plan:")]
    if not expect_debug:
        assert lines.lines == [], lines.lines
        return
    assert len(misses) == 1, lines.lines                         # cached afterwards: logged once
    assert "S(0)" in misses[0] and "=> [S(0)]" in misses[0], misses
    assert any("aten::sum.dim_IntList" in m for _, m in lines.lines), lines.lines
    if world_size > 1:
        assert any("P(sum)" in p for p in plans), plans              # the sum's pending reduction resolved
    assert all(lvl == logging.DEBUG for lvl, _ in lines.lines)
    # Turned off at run time: the next miss logs nothing.
    torch._logging.set_logs(modules={"shardtensor": logging.WARNING})
    lines.lines.clear()
    (x - 1).abs()
    assert lines.lines == [], lines.lines


@pytest.mark.parametrize("world_size", [1, 3])
def test_debug_level_shows_misses_and_plans(world_size):
    run_ranks(debug_body, world_size, True)


def test_no_log_lines_by_default():
    run_ranks(debug_body, 2, False)


SCRIPT = """
import torch, shardtensor as st
mesh = st.init_device_mesh("cpu", (1,))
x = st.distribute_tensor(torch.ones(4, 2), mesh, [st.Shard(0)])
(x * 2).sum()
"""


@pytest.mark.parametrize("setting, shown", [("+shardtensor", True), ("shardtensor", False), ("-shardtensor", False)])
def test_torch_logs_environment_variable(setting, shown):
    """torch reads TORCH_LOGS when it is imported, before shardtensor: a process of its own."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCH_LOGS": setting, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
    env.pop("SHARDTENSOR_LOG", None)
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert ("propagation miss: aten::mul.Tensor" in run.stderr) == shown, run.stderr


def per_call_body(rank, world_size):
    import shardtensor as st

    lines = Lines()
    logging.getLogger("shardtensor").addHandler(lines)
    assert logging.getLogger("shardtensor").isEnabledFor(logging.INFO)
    mesh = st.init_device_mesh("cpu", (world_size,))
    x = st.distribute_tensor(torch.arange(6.0), mesh, [st.Shard(0)])
    for _ in range(2):
        x.neg()
    calls = [m for lvl, m in lines.lines if lvl == logging.INFO and m.startswith("aten::neg")]
    assert len(calls) == 2 and "[S(0)]" in calls[0], lines.lines


def test_shardtensor_log_env_shows_each_call():
    run_ranks(per_call_body, 2, env={"SHARDTENSOR_LOG": "1", "TORCH_LOGS": ""})
