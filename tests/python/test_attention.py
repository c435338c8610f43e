"""Context-parallel attention from Python: F.scaled_dot_product_attention on sequence shards
(the ring), the zigzag layout for causal load balance, and a transformer block trained with
Adam on a sequence-split batch, each against the same computation on one process."""

import copy

import pytest
import torch
import torch.nn.functional as F

from oracle import assert_close, chunk_sizes
from ranks import run_ranks
from test_training import compare_parameters, shard_parameters, train

WORLD_SIZES = [1, 2, 3, 4]


class Block(torch.nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP, each with a residual."""

    def __init__(self, embed: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(embed), torch.nn.LayerNorm(embed)
        self.qkv, self.proj = torch.nn.Linear(embed, 3 * embed), torch.nn.Linear(embed, embed)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(embed, 2 * embed), torch.nn.GELU(), torch.nn.Linear(2 * embed, embed))

    def forward(self, x):
        b, s, e = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, e // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, s, e))
        return x + self.mlp(self.norm2(x))


def block_body(rank, world_size, zigzag):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    single = Block(8, 2).double()
    model = shard_parameters(copy.deepcopy(single), mesh, lambda name, p: [st.Replicate()])
    seq = 4 * world_size + 3  # uneven in both layouts
    data = [(torch.randn(2, seq, 8, dtype=torch.float64), torch.randn(2, seq, 8, dtype=torch.float64))]
    sharded = [(st.distribute_tensor(x, mesh, [st.Shard(1)]), st.distribute_tensor(y, mesh, [st.Shard(1)])) for x, y in data]
    if zigzag:
        sharded = [(st.zigzag_shard(x, 0, 1), st.zigzag_shard(y, 0, 1)) for x, y in sharded]
        assert sharded[0][0].placements == (st.ZigzagShard(1),)
        assert list(sharded[0][0].shard_sizes()[1]) == st.zigzag_shard_sizes(seq, world_size)
    with st.CommDebugMode() as comms:
        sharded_losses = train(model, torch.optim.Adam(model.parameters(), lr=0.02), sharded, 3, clip=0)
    single_losses = train(single, torch.optim.Adam(single.parameters(), lr=0.02), data, 3, clip=0)
    for step, (a, b) in enumerate(zip(sharded_losses, single_losses)):
        assert_close(a.full_tensor(), b.detach(), f"loss at step {step}", rtol=1e-9, atol=1e-12)
    compare_parameters(model, single, "after 3 Adam steps", rtol=1e-8, atol=1e-10)
    # The sequence never gathers (linear layers included): K and V travel the ring as messages.
    counts = comms.get_comm_counts()
    assert counts.get("all_gather", 0) == 0, comms.table()
    assert (counts.get("ring_send_recv", 0) > 0) == (world_size > 1), comms.table()
    assert st.fallback_operators() == [], st.fallback_operators()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("zigzag", [False, True], ids=["contiguous", "zigzag"])
def test_transformer_block_on_a_split_sequence_matches_one_process(world_size, zigzag):
    run_ranks(block_body, world_size, zigzag)


def layout_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(1)
    x = torch.randn(2, 3, 2 * world_size + 1, 4)
    s = x.shape[2]
    sizes = st.zigzag_shard_sizes(s, world_size)
    assert sum(sizes) == s and len(sizes) == world_size
    z = st.zigzag_shard(st.distribute_tensor(x, mesh, [st.Shard(2)]), mesh_dim=0, seq_dim=2)
    assert z.placements == (st.ZigzagShard(2),) and list(z.shard_sizes()[2]) == sizes
    assert torch.equal(z.full_tensor(), x)  # the layout is zigzag, the tensor is the sequence in order
    # Rank r holds chunk r, then chunk 2n - 1 - r (the longer chunks first).
    lengths = [s // (2 * world_size) + (i < s % (2 * world_size)) for i in range(2 * world_size)]
    starts = [sum(lengths[:i]) for i in range(2 * world_size)]
    early, late = rank, 2 * world_size - 1 - rank
    expected = torch.cat([x.narrow(2, starts[early], lengths[early]), x.narrow(2, starts[late], lengths[late])], 2)
    assert torch.equal(z.to_local(), expected)
    back = st.zigzag_unshard(z, 0, 2)
    assert list(back.shard_sizes()[2]) == chunk_sizes(s, world_size)
    assert torch.equal(back.full_tensor(), x)
    # Differentiable: the gradient comes back in the source's layout.
    leaf = st.distribute_tensor(x, mesh, [st.Replicate()]).requires_grad_()
    (st.zigzag_shard(leaf, 0, 2) * 2).sum().backward()
    assert_close(leaf.grad.full_tensor(), torch.full_like(x, 2.0), "gradient through zigzag_shard")
    with pytest.raises(ValueError, match="mesh_dim 1 is not a dim"):
        st.zigzag_shard(z, mesh_dim=1, seq_dim=2)
    if world_size > 1:
        plain = st.distribute_tensor(torch.randn(1, 2, s, 4), mesh, [st.Shard(2)], sharding_shapes={2: [s] + [0] * (world_size - 1)})
        with pytest.raises(ValueError, match=r"zigzag_unshard: expects the sequence \(dim 2\) split in zigzag order"):
            st.zigzag_unshard(plain, 0, 2)


@pytest.mark.parametrize("world_size", [1, 3])
def test_zigzag_layout_round_trips_and_checks_its_input(world_size):
    run_ranks(layout_body, world_size)
