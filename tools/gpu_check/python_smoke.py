"""One rank of the Python CUDA path, step by step, each step printed before it runs, so that a
crash (run.sh runs this under faulthandler, then under cuda-gdb for the native stack) names the
step that crashed. Run as rank 0 of world size 1: run.sh sets RANK, WORLD_SIZE and MASTER_*."""

import torch


def step(what):
    print(f"python_smoke: {what}", flush=True)


step("import shardtensor")
import shardtensor as st  # noqa: E402

step("init_device_mesh('cuda', (1,))")
mesh = st.init_device_mesh("cuda", (1,))
# The CPU path first, on the same process group's gloo backend: a crash there too points at
# this torch build (ABI, pybind11), not at CUDA.
step(f"mesh {mesh}; a cpu mesh and distribute_tensor on CPU")
cpu_mesh = st.DeviceMesh("cpu", [0])
c = st.distribute_tensor(torch.arange(6.0).reshape(2, 3), cpu_mesh, [st.Shard(0)])
step(f"cpu: {c.to_local().tolist()}; (c * 2).sum()")
assert (c * 2).sum().full_tensor().item() == 30.0
g = torch.arange(35, dtype=torch.float32, device="cuda").reshape(7, 5)
step("from_local on CUDA")
f = st.from_local(g, mesh, [st.Replicate()])
step(f"from_local gave {tuple(f.shape)}; distribute_tensor(src_data_rank=None) on CUDA")
x = st.distribute_tensor(g, mesh, [st.Shard(0)], src_data_rank=None)
step("distribute_tensor(src_data_rank=0) on CUDA")
x = st.distribute_tensor(g, mesh, [st.Shard(0)])
step(f"to_local on {x.to_local().device}")
step("redistribute to Replicate")
r = x.redistribute(mesh, [st.Replicate()])
step("ops: (x * 2).relu().sum(0)")
y = (x * 2).relu().sum(0)
step("full_tensor")
assert torch.equal(y.full_tensor(), (g * 2).relu().sum(0))
step("scaled_dot_product_attention on sequence shards")
q = st.distribute_tensor(torch.randn(1, 2, 16, 64, device="cuda"), mesh, [st.Shard(2)])
out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
step(f"done: {out.shape}")
