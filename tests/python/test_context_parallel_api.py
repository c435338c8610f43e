"""DTensor's context_parallel entry point: plain buffers cut in place into zigzag pieces, SDPA on
the pieces running ring attention, context_parallel_unshard, the buffers restored on exit, and
the arguments refused on every rank. World sizes 1-4 (sequences divisible by 2n, uneven, and
shorter than 2n, so some rank holds an empty piece), against one process."""

import pytest
import torch
import torch.nn.functional as F

from oracle import assert_close
from ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4]


def zigzag_piece(t, seq_dim, rank, ranks):
    """Rank `rank`'s zigzag piece of `t`: chunks rank and 2n - 1 - rank of 2n, the longer chunks first."""
    s, chunks = t.shape[seq_dim], 2 * ranks
    lengths = [s // chunks + (i < s % chunks) for i in range(chunks)]
    starts = [sum(lengths[:i]) for i in range(chunks)]
    early, late = rank, chunks - 1 - rank
    return torch.cat([t.narrow(seq_dim, starts[early], lengths[early]), t.narrow(seq_dim, starts[late], lengths[late])], seq_dim)


def sequence_lengths(world_size):
    """Divisible by 2n, uneven, and (n > 1) shorter than 2n with an empty piece on the last rank."""
    return [4 * world_size, 13] + ([world_size - 1] if world_size > 1 else [])


def attention_body(rank, world_size, causal):
    import shardtensor as st
    from shardtensor import context_parallel, context_parallel_unshard  # DTensor's usage, only the import changed

    mesh = st.init_device_mesh("cpu", (world_size,))
    original = F.scaled_dot_product_attention
    for seq in sequence_lengths(world_size):
        what = f"seq {seq}, causal={causal}"
        torch.manual_seed(seq)
        q, k, v = (torch.randn(2, 2, seq, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
        w = torch.randn(2, 2, seq, 4, dtype=torch.float64)
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        (expected * w).sum().backward()

        # As DTensor's own tests: detached copies are the buffers, requires_grad set inside.
        cp_q, cp_k, cp_v, cp_w = (t.detach().clone() for t in (q, k, v, w))
        with context_parallel(mesh, buffers=(cp_q, cp_k, cp_v, cp_w), buffer_seq_dims=(2, 2, 2, 2)):
            assert F.scaled_dot_product_attention is not original
            for cp, whole in ((cp_q, q), (cp_k, k), (cp_v, v), (cp_w, w)):
                assert torch.equal(cp, zigzag_piece(whole.detach(), 2, rank, world_size)), what
            for t in (cp_q, cp_k, cp_v):
                t.requires_grad = True
            with st.CommDebugMode() as comms:
                out = F.scaled_dot_product_attention(cp_q, cp_k, cp_v, is_causal=causal)
                assert type(out) is torch.Tensor and out.shape == cp_q.shape, what
                (out * cp_w).sum().backward()
            cp_q.requires_grad = cp_k.requires_grad = False
            # cp_v keeps requires_grad: the exit restores it all the same.
            whole_out, whole_w = context_parallel_unshard(mesh, [out, cp_w], [2, -2])
        assert F.scaled_dot_product_attention is original, what
        assert cp_v.requires_grad and cp_v.shape == v.shape, what
        for cp, whole in ((cp_q, q), (cp_k, k), (cp_v, v), (cp_w, w)):
            assert torch.equal(cp.detach(), whole.detach()), f"{what}: buffer restored"
        grads = context_parallel_unshard(mesh, [cp_q.grad, cp_k.grad, cp_v.grad], [2, 2, 2])
        assert_close(whole_out, expected.detach(), f"{what}: output", rtol=1e-10, atol=1e-10)
        assert torch.equal(whole_w, w), what
        for name, got, leaf in zip("qkv", grads, (q, k, v)):
            assert_close(got, leaf.grad, f"{what}: d{name}", rtol=1e-10, atol=1e-10)
        # K and V travel the ring (where more than one rank holds keys) and never gather: the only
        # all-gathers are from_local's agreement rows, one per query, key and value.
        counts = comms.get_comm_counts()
        holders = sum(1 for size in st.zigzag_shard_sizes(seq, world_size) if size)
        assert (counts.get("ring_send_recv", 0) > 0) == (holders > 1), f"{what}\n{comms.table()}"
        assert counts.get("all_gather", 0) == (3 if world_size > 1 else 0), f"{what}\n{comms.table()}"
    assert st.fallback_operators() == [], st.fallback_operators()


def attention_and_restore_body(rank, world_size):
    # One launch per world size (spawning ranks is most of a test's time on CI's two cores).
    for causal in (True, False):
        attention_body(rank, world_size, causal)
    if world_size in (1, 3):
        restore_body(rank, world_size)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_dtensor_usage_matches_one_process_and_buffers_are_restored(world_size):
    run_ranks(attention_and_restore_body, world_size, timeout=600)


def restore_body(rank, world_size):
    import shardtensor as st
    from shardtensor.experimental import context_parallel

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    inputs, labels, kept = torch.randn(3, 11), torch.arange(11), torch.randn(4, 11, 2)
    originals = [t.clone() for t in (inputs, labels, kept)]
    with st.CommDebugMode() as comms:  # no collective of shardtensor at entry or exit
        with context_parallel(mesh, buffers=[inputs, labels, kept], buffer_seq_dims=[-1, 0, 1], no_restore_buffers={kept}):
            size = st.zigzag_shard_sizes(11, world_size)[rank]
            assert inputs.shape == (3, size) and labels.shape == (size,) and kept.shape == (4, size, 2)
            for t, o, d in zip((inputs, labels, kept), originals, (1, 0, 1)):
                assert torch.equal(t, zigzag_piece(o, d, rank, world_size))
            inputs.mul_(0)  # changes inside do not survive the exit
    assert comms.get_total_counts() == 0, comms.table()
    assert torch.equal(inputs, originals[0]) and torch.equal(labels, originals[1])
    assert torch.equal(kept, zigzag_piece(originals[2], 1, rank, world_size)), "no_restore_buffers keep the piece"

    # An exception inside: buffers restored, SDPA and the zigzag setting as before.
    original = F.scaled_dot_product_attention
    with pytest.raises(KeyError, match="inside"):
        with context_parallel(mesh, buffers=[inputs], buffer_seq_dims=[1]):
            raise KeyError("inside")
    assert F.scaled_dot_product_attention is original
    assert torch.equal(inputs, originals[0])
    # No buffers: only the patch.
    with context_parallel(mesh):
        assert F.scaled_dot_product_attention is not original
    assert F.scaled_dot_product_attention is original



def errors_body(rank, world_size):
    import shardtensor as st
    from shardtensor import context_parallel, context_parallel_unshard

    mesh = st.init_device_mesh("cpu", (world_size,))
    original = F.scaled_dot_product_attention
    x = torch.zeros(2, 5)
    with pytest.raises(ValueError, match=r"buffer_seq_dims\[0\] = 2 is out of range for buffer 0 of shape \(2, 5\): "
                                         r"allowed are -2 to 1"):
        with context_parallel(mesh, buffers=[x], buffer_seq_dims=[2]):
            pass
    with pytest.raises(ValueError, match="buffers has 2 entries and buffer_seq_dims 1"):
        with context_parallel(mesh, buffers=[x, x.clone()], buffer_seq_dims=[0]):
            pass
    shard = st.distribute_tensor(torch.zeros(6, 2), mesh, [st.Shard(0)])
    with pytest.raises(ValueError, match="buffer 1 is a ShardTensor"):
        with context_parallel(mesh, buffers=[x, shard], buffer_seq_dims=[1, 0]):
            pass
    with pytest.raises(ValueError, match="buffer 0 is a list"):
        with context_parallel(mesh, buffers=[[1, 2]], buffer_seq_dims=[0]):
            pass
    with pytest.raises(ValueError, match="buffer 0 requires grad.*set its requires_grad = True inside the block"):
        with context_parallel(mesh, buffers=[torch.zeros(3, requires_grad=True)], buffer_seq_dims=[0]):
            pass
    with pytest.raises(ValueError, match="no_restore_buffers must be a subset of buffers"):
        with context_parallel(mesh, buffers=[x], buffer_seq_dims=[0], no_restore_buffers={x.clone()}):
            pass
    with pytest.raises(ValueError, match="expects a 1-D mesh"):
        with context_parallel(st.init_device_mesh("cpu", (1, world_size)), buffers=[x], buffer_seq_dims=[0]):
            pass
    assert x.shape == (2, 5) and F.scaled_dot_product_attention is original

    # SDPA on a tensor that is no buffer's piece; with a mask. Both leave everything as before.
    q = torch.randn(1, 2, 13, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="sequence length 100 on rank .* no sharded buffer's piece"):
        with context_parallel(mesh, buffers=[q], buffer_seq_dims=[2]):
            y = torch.randn(1, 2, 100, 4, dtype=torch.float64)
            F.scaled_dot_product_attention(y, y, y)
    with pytest.raises(ValueError, match="takes is_causal, not attn_mask"):
        with context_parallel(mesh, buffers=[q], buffer_seq_dims=[2]):
            F.scaled_dot_product_attention(q, q, q, torch.ones(q.shape[2], q.shape[2], dtype=torch.bool))
    assert q.shape == (1, 2, 13, 4) and F.scaled_dot_product_attention is original

    if world_size > 1:
        # Ranks that disagree: every rank learns it, none waits.
        mine = torch.zeros(1, 12 if rank == 0 else 13)
        with pytest.raises(ValueError, match="the ranks passed different buffers"):
            with context_parallel(mesh, buffers=[mine], buffer_seq_dims=[1]):
                pass
        told = "" if rank == 1 else "on rank 1: "  # rank 1 passed it; the others learn it from rank 1
        with pytest.raises(ValueError, match=rf"context_parallel: {told}buffer_seq_dims\[0\] = 5 is out of range"):
            with context_parallel(mesh, buffers=[x], buffer_seq_dims=[5 if rank == 1 else 1]):
                pass
        # Only rank 0's query is no buffer's piece: every rank stops, none waits.
        with pytest.raises(ValueError, match="no sharded buffer's piece" if rank == 0 else "could not take its query"):
            with context_parallel(mesh, buffers=[q], buffer_seq_dims=[2]):
                y = torch.randn(1, 2, 100, 4, dtype=torch.float64) if rank == 0 else q
                F.scaled_dot_product_attention(y, q, q, is_causal=True)
        assert q.shape == (1, 2, 13, 4) and F.scaled_dot_product_attention is original
        # Buffers of lengths 4n and 4n + 1 give ranks 1.. pieces of one length: SDPA cannot tell them apart.
        a, b = torch.randn(1, 1, 4 * world_size, 2), torch.randn(1, 1, 4 * world_size + 1, 2)
        with pytest.raises(ValueError, match="cannot tell which sequence"):
            with context_parallel(mesh, buffers=[a, b], buffer_seq_dims=[2, 2]):
                F.scaled_dot_product_attention(a, a, a, is_causal=True)
        # Pieces that are not zigzag pieces.
        with pytest.raises(ValueError, match=r"lengths \[2, 0.*but zigzag pieces of a sequence of 2 have \[1, 1"):
            context_parallel_unshard(mesh, [torch.zeros(1, 2 if rank == 0 else 0)], [1])
    with pytest.raises(ValueError, match=r"seq_dims\[0\] = 3 is out of range"):
        context_parallel_unshard(mesh, [x], [3])

    # Still usable afterwards.
    torch.manual_seed(0)
    q = torch.randn(1, 2, 9, 4, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    with context_parallel(mesh, buffers=[q], buffer_seq_dims=[2]):
        out = context_parallel_unshard(mesh, [F.scaled_dot_product_attention(q, q, q, is_causal=True)], [2])[0]
    assert_close(out, expected, "after the refusals", rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_bad_arguments_raise_on_every_rank(world_size):
    run_ranks(errors_body, world_size)
