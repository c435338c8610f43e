"""CommDebugMode's module view, DTensor's surface: collectives per module in forward and
backward (children included), parameter and sharding info, the tracing table at each noise
level, its JSON dump and its log file. World sizes 1-4."""

import json
import os

import pytest
import torch

from ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4]


def module_counts_body(rank, world_size, folder):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):  # R -> S(0) cuts locally; its backward gathers the gradient
            return self.lin(x).redistribute(mesh, [st.Shard(0)])

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):  # the whole: one all-gather; its backward cuts locally
            return self.inner(x).full_tensor()

    torch.manual_seed(0)
    model = Outer()
    for name in ("weight", "bias"):
        p = getattr(model.inner.lin, name).detach()
        setattr(model.inner.lin, name, torch.nn.Parameter(st.distribute_tensor(p, mesh, [st.Replicate()])))
    x = st.distribute_tensor(torch.randn(4 * world_size + 1, 4), mesh, [st.Replicate()])  # no empty piece
    with st.CommDebugMode() as comms:
        model(x).sum().backward()

    one = {"all_gather": 1} if world_size > 1 else {}
    assert comms.comm_module_counts == {
        "Global": {"forward": one, "backward": one},
        "Outer": {"forward": one, "backward": one},        # its child's backward included
        "Outer.inner": {"forward": {}, "backward": one},
        "Outer.inner.lin": {"forward": {}, "backward": {}},
    }, comms.comm_module_counts
    assert comms.get_comm_counts() == {k: 2 * v for k, v in one.items()}
    module_bytes = comms.get_module_bytes()
    assert module_bytes["Outer.inner"]["forward"] == 0
    assert (module_bytes["Outer.inner"]["backward"] > 0) == (world_size > 1)
    assert module_bytes["Global"]["backward"] == module_bytes["Outer.inner"]["backward"]

    params = comms.get_parameter_info()
    assert set(params) == {"Outer.inner.lin"} and set(params["Outer.inner.lin"]) == {"weight", "bias"}
    assert comms.get_sharding_info() == {"Outer.inner.lin.weight": (st.Replicate(),),
                                         "Outer.inner.lin.bias": (st.Replicate(),)}

    quiet = comms.generate_comm_debug_tracing_table(noise_level=0)
    assert "Outer.inner (Inner)" in quiet and "parameter" not in quiet, quiet
    assert ("BACKWARD PASS" in quiet) == (world_size > 1)
    loud = comms.generate_comm_debug_tracing_table(noise_level=2)
    assert "parameter weight: (Replicate(),)" in loud
    if world_size > 1:
        assert "all_gather x1" in loud  # the operator that issued it
    with pytest.raises(ValueError, match="noise_level"):
        comms.generate_comm_debug_tracing_table(noise_level=4)

    path = os.path.join(folder, f"comm_{rank}.json")
    comms.generate_json_dump(path, noise_level=1)
    with open(path) as f:
        tree = json.load(f)
    assert tree["fqn"] == "Global" and tree["children"][0]["fqn"] == "Outer"
    inner = tree["children"][0]["children"][0]
    assert inner["fqn"] == "Outer.inner" and inner["backward"] == one and inner["module_type"] == "Inner"
    log = os.path.join(folder, f"comm_{rank}.txt")
    comms.log_comm_debug_tracing_table_to_file(log, noise_level=0)
    comms.log_comm_debug_tracing_table_to_file(log, noise_level=0)
    with open(log) as f:
        assert f.read() == quiet * 2


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_comm_debug_mode_counts_per_module(world_size, tmp_path):
    run_ranks(module_counts_body, world_size, str(tmp_path))
