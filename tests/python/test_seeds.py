"""Issue 76, seeds: torch.manual_seed decides every random operator on ShardTensors.

- the same torch seed gives the same global values whatever the layout (split, uneven, empty
  pieces, replicated) and the number of ranks (1-4, compared across launches), run after run;
- a parallelized model initialised with nn.init.trunc_normal_ after torch.manual_seed gives the
  same weights each time it is seeded alike, and the same weights at every world size;
- get_rng_state / set_rng_state and fork_rng replay the draws;
- ranks that seed torch differently raise on every rank at the first draw;
- st.manual_seed gives shardtensor its own stream, which torch.manual_seed then leaves alone.
"""

import pytest
import torch
from torch import nn

from oracle import assert_close
from ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4]


def _draws(st, mesh, world_size):
    """The global values of a few random calls on several layouts, after torch.manual_seed(19)."""
    uneven = {0: [0] + [7 // max(world_size - 1, 1)] * (world_size - 1)} if world_size > 1 else None
    if uneven:
        uneven[0][-1] += 7 - sum(uneven[0])
    out = {}
    for name, placements, sizes in (("split", [st.Shard(0)], None), ("split dim 1", [st.Shard(1)], None),
                                    ("uneven with an empty piece", [st.Shard(0)], uneven), ("replicated", [st.Replicate()], None)):
        torch.manual_seed(19)
        a = st.randn(7, 5, device_mesh=mesh, placements=placements, sharding_shapes=sizes)
        b = torch.nn.functional.dropout(st.distribute_tensor(torch.ones(7, 5), mesh, placements), 0.5)
        c = st.distribute_tensor(torch.zeros(7, 5), mesh, placements).uniform_(-1, 1)
        out[name] = [t.full_tensor() for t in (a, b, c)]
    return out


def seeds_body(rank, world_size, folder):
    import shardtensor as st
    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = st.init_device_mesh("cpu", (world_size,))
    draws = _draws(st, mesh, world_size)
    reference = draws["split"]
    for name, values in draws.items():
        for k, (got, want) in enumerate(zip(values, reference)):
            assert torch.equal(got, want), f"draw {k} on layout '{name}' differs from the split layout's"
    assert not torch.equal(reference[0], _draws(st, mesh, world_size)["split"][0] * 0), "draws are not all zero"
    again = _draws(st, mesh, world_size)["split"]
    assert all(torch.equal(a, b) for a, b in zip(again, reference)), "the same seed twice gave other values"

    # A parallelized model's initialisation (trunc_normal_ on its ShardTensor weights).
    def initialised():
        model = parallelize_module(nn.Sequential(nn.Linear(6, 9), nn.Linear(9, 6)), mesh,
                                   {"0": ColwiseParallel(), "1": RowwiseParallel()})
        torch.manual_seed(23)
        for p in model.parameters():
            nn.init.trunc_normal_(p, std=0.02)
        return [p.full_tensor() if isinstance(p, st.ShardTensor) else p.detach() for p in model.parameters()]

    first, second = initialised(), initialised()
    assert all(torch.equal(a, b) for a, b in zip(first, second)), "torch.manual_seed then trunc_normal_ twice differs"

    # The generator's state replays ShardTensor draws as it replays plain ones.
    state = torch.get_rng_state()
    x = st.randn(5, 3, device_mesh=mesh, placements=[st.Shard(0)]).full_tensor()
    torch.set_rng_state(state)
    y = st.randn(5, 3, device_mesh=mesh, placements=[st.Replicate()]).full_tensor()
    assert torch.equal(x, y), "set_rng_state did not replay the draw"
    with torch.random.fork_rng():
        inside = st.randn(5, 3, device_mesh=mesh, placements=[st.Shard(0)]).full_tensor()
    after = st.randn(5, 3, device_mesh=mesh, placements=[st.Shard(0)]).full_tensor()
    assert torch.equal(inside, after), "fork_rng did not restore the generator for ShardTensor draws"

    if rank == 0:
        torch.save({"draws": reference, "model": first}, f"{folder}/ranks{world_size}.pt")


def test_torch_manual_seed_decides_shardtensor_draws_on_any_layout_and_world_size(tmp_path):
    for world_size in WORLD_SIZES:
        run_ranks(seeds_body, world_size, str(tmp_path))
    one = torch.load(tmp_path / "ranks1.pt")
    for world_size in WORLD_SIZES[1:]:
        other = torch.load(tmp_path / f"ranks{world_size}.pt")
        for k, (a, b) in enumerate(zip(other["draws"], one["draws"])):
            assert torch.equal(a, b), f"draw {k} at {world_size} ranks differs from 1 rank's"
        for k, (a, b) in enumerate(zip(other["model"], one["model"])):
            assert_close(a, b, f"parameter {k} initialised at {world_size} ranks")


def rank_seeds_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(100 + rank)
    with pytest.raises(ValueError, match="seeded torch differently"):
        st.randn(4, 4, device_mesh=mesh, placements=[st.Replicate()])
    # Its own stream: torch's seed no longer matters, and every rank agrees again.
    st.manual_seed(5, mesh)
    a = st.randn(4, 4, device_mesh=mesh, placements=[st.Replicate()]).to_local()
    st.manual_seed(5, mesh)
    torch.manual_seed(7 * rank)
    b = st.randn(4, 4, device_mesh=mesh, placements=[st.Shard(0)]).full_tensor()
    assert torch.equal(a, b)


def test_ranks_seeding_torch_differently_raise_on_every_rank():
    run_ranks(rank_seeds_body, 3)
