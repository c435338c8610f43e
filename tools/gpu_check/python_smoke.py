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
step(f"mesh {mesh}; distribute_tensor")
g = torch.arange(35, dtype=torch.float32, device="cuda").reshape(7, 5)
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
