"""ZigzagShard as a layout: the order is the spec's, the tensor is the sequence in order.

Every result is checked against the same computation on one process: redistributes into and out
of zigzag order from every layout (uneven lengths, empty chunks, a 2-D mesh), operators whose
rules carry the order (a positional buffer in order meets the zigzag sequence position by
position; a linear layer on [B, S, E] keeps the order through its flattening), an operator
whose rule does not (its inputs go back in order first, with a one-time warning, or an error
in strict mode), and gradients through all of it."""

import os
import warnings

import pytest
import torch

from oracle import assert_close
from ranks import run_ranks


def zigzag_pieces(x, dim, n, r):
    """Rank r's zigzag piece of x along dim: chunk r, then chunk 2n - 1 - r (the longer chunks first)."""
    s = x.shape[dim]
    lengths = [s // (2 * n) + (i < s % (2 * n)) for i in range(2 * n)]
    starts = [sum(lengths[:i]) for i in range(2 * n)]
    return torch.cat([x.narrow(dim, starts[c], lengths[c]) for c in (r, 2 * n - 1 - r)], dim)


def redistribute_body(rank, world_size, checkpoint_dir):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    n = world_size
    for length in (6 * n, 6 * n + 2 * n - 1, max(n - 1, 1)):  # even chunks, uneven ones, empty chunks
        x = torch.randn(2, length, 3, dtype=torch.float64)
        z = st.distribute_tensor(x, mesh, [st.ZigzagShard(1)])
        assert z.placements == (st.ZigzagShard(1),), z.placements
        assert torch.equal(z.to_local(), zigzag_pieces(x, 1, n, rank)), f"length {length}"
        cut = st.distribute_tensor(x, mesh, [st.ZigzagShard(1)], src_data_rank=None)  # each rank cuts its own
        assert torch.equal(cut.to_local(), z.to_local()), f"length {length}: cut locally"
        assert torch.equal(z.full_tensor(), x), f"length {length}: the tensor is the sequence in order"
        uneven = [length] + [0] * (n - 1)
        for placements, sizes in (([st.Shard(1)], None), ([st.Shard(1)], {1: uneven}), ([st.Shard(0)], None),
                                  ([st.Shard(2)], None), ([st.Replicate()], None)):
            other = st.distribute_tensor(x, mesh, placements, sharding_shapes=sizes) if sizes else st.distribute_tensor(x, mesh, placements)
            moved = z.redistribute(mesh, placements) if not sizes else st.zigzag_unshard(z, 0, 1).redistribute(mesh, placements, sharding_shapes=sizes)
            assert torch.equal(moved.to_local(), other.to_local()), f"{length}: zigzag -> {placements} {sizes}"
            back = other.redistribute(mesh, [st.ZigzagShard(1)])
            assert torch.equal(back.to_local(), z.to_local()), f"{length}: {placements} {sizes} -> zigzag"

    # Another unit (a [s, 3] sequence flattened to [3 s]) is another order: one exchange between the two.
    x = torch.randn(2, 3 * (4 * n + 1), dtype=torch.float64)
    by_three, by_one = (st.distribute_tensor(x, mesh, [st.ZigzagShard(1, unit)]) for unit in (3, 1))
    with st.CommDebugMode() as comms:
        moved = by_three.redistribute(mesh, [st.ZigzagShard(1)])
    assert torch.equal(moved.to_local(), by_one.to_local()), "unit 3 -> unit 1"
    assert comms.get_total_counts() == (1 if n > 1 else 0), comms.table()
    assert torch.equal(by_one.redistribute(mesh, [st.ZigzagShard(1, 3)]).to_local(), by_three.to_local()), "unit 1 -> unit 3"

    if world_size == 4:  # a 2-D mesh: batch over mesh dim 0, the sequence in zigzag order over mesh dim 1
        mesh2 = st.init_device_mesh("cpu", (2, 2))
        x = torch.randn(3, 11, 2, dtype=torch.float64)
        z = st.distribute_tensor(x, mesh2, [st.Shard(0), st.ZigzagShard(1)])
        assert torch.equal(z.full_tensor(), x)
        for placements in ([st.Replicate(), st.ZigzagShard(1)], [st.Shard(1), st.Shard(0)], [st.Replicate(), st.Replicate()]):
            assert torch.equal(z.redistribute(mesh2, placements).full_tensor(), x), placements
            assert torch.equal(z.redistribute(mesh2, placements).to_local(),
                               st.distribute_tensor(x, mesh2, placements).to_local()), placements

    # A checkpoint holds the tensor in order: it loads into any layout, zigzag or not.
    import shardtensor.checkpoint as dcp

    x = torch.randn(3, 4 * n + 3, dtype=torch.float64)
    path = os.path.join(checkpoint_dir, "ckpt")
    dcp.save({"x": st.distribute_tensor(x, mesh, [st.ZigzagShard(1)])}, path)
    for placements in ([st.ZigzagShard(1)], [st.Shard(1)], [st.ZigzagShard(0)]):
        into = st.distribute_tensor(torch.zeros_like(x), mesh, placements)
        dcp.load({"x": into}, path)
        assert torch.equal(into.full_tensor(), x), placements

    # Zigzag sizes are the only sizes a ZigzagShard takes; DTensor has no such placement.
    if world_size > 1:
        with pytest.raises(ValueError, match="zigzag"):
            st.distribute_tensor(torch.zeros(2, 4 * n + 1), mesh, [st.ZigzagShard(1)], sharding_shapes={1: [4 * n + 1] + [0] * (n - 1)})
        with pytest.raises(ValueError, match="zigzag"):
            st.to_dtensor(st.distribute_tensor(torch.zeros(2, 8), mesh, [st.ZigzagShard(1)]))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_zigzag_redistributes_to_and_from_every_layout(world_size, tmp_path):
    run_ranks(redistribute_body, world_size, str(tmp_path))


def operators_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(3)
    b, s, e = 2, 5 * world_size + 1, 4
    x = torch.randn(b, s, e, dtype=torch.float64)
    positions = torch.randn(s, 1, dtype=torch.float64)  # a positional buffer, in order, whole on every rank
    linear = torch.nn.Linear(e, 3, dtype=torch.float64)
    weight, bias = (st.distribute_tensor(p.detach(), mesh, [st.Replicate()]).requires_grad_() for p in (linear.weight, linear.bias))
    leaf = st.distribute_tensor(x, mesh, [st.Shard(1)]).requires_grad_()

    with warnings.catch_warnings(record=True) as caught, st.CommDebugMode() as comms:
        warnings.simplefilter("always")
        z = st.zigzag_shard(leaf, 0, 1)
        y = torch.nn.functional.linear(torch.tanh(z * positions), weight, bias)  # carried all the way
    assert y.placements == (st.ZigzagShard(1),), y.placements
    assert not [w for w in caught if "zigzag" in str(w.message)], [str(w.message) for w in caught]
    assert comms.get_comm_counts().get("all_gather", 0) == 0, comms.table()
    ref_x = x.clone().requires_grad_()
    ref_w, ref_b = linear.weight.detach().clone().requires_grad_(), linear.bias.detach().clone().requires_grad_()
    expected = torch.nn.functional.linear(torch.tanh(ref_x * positions), ref_w, ref_b)
    assert_close(y.full_tensor(), expected.detach(), "linear(tanh(x * positions)) on a zigzag sequence")

    # cumsum reads positions along the sequence: its rule does not carry the order, so the
    # input goes back in order first, with a warning naming it, once (the ranks run in strict
    # mode, so everything above went without it).
    with warnings.catch_warnings(record=True) as caught, st.strict(False):
        warnings.simplefilter("always")
        summed = torch.cumsum(y, dim=1)
        torch.cumsum(y, dim=1)
    named = [str(w.message) for w in caught if "aten::cumsum" in str(w.message) and "zigzag" in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in caught]
    assert not any(p.is_shard() and isinstance(p, st.ZigzagShard) for p in summed.placements), summed.placements
    expected_summed = torch.cumsum(expected, dim=1)
    assert_close(summed.full_tensor(), expected_summed.detach(), "cumsum of a zigzag sequence")

    (summed * summed).sum().backward()
    (expected_summed * expected_summed).sum().backward()
    assert leaf.grad.placements == (st.Shard(1),), leaf.grad.placements
    assert_close(leaf.grad.full_tensor(), ref_x.grad, "gradient of the sequence")
    assert_close(weight.grad.full_tensor(), ref_w.grad, "gradient of the weight")
    assert_close(bias.grad.full_tensor(), ref_b.grad, "gradient of the bias")

    # Strict mode: an operator that would put the order back raises on every rank instead.
    with st.strict():
        with pytest.raises(NotImplementedError, match="zigzag"):
            torch.cumsum(y.detach(), dim=1)


@pytest.mark.parametrize("world_size", [1, 3])
def test_operators_carry_the_zigzag_order_or_put_it_back(world_size):
    run_ranks(operators_body, world_size)
