"""A rank's exit after its last collective: the world group is freed (and its Gloo workers joined)
before the interpreter finalizes, even where torch.distributed.nn was imported after
init_process_group (torch._dynamo, CommDebugMode and torch.compile import it). A worker still
alive then aborts the process now and then ("terminate called without an active exception")."""

import atexit
import os
import sys

import pytest

from ranks import run_ranks


def _gloo_workers() -> int:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # the thread ended while we listed
            pass
    return sum(name == "pt_gloo_runloop" for name in names)


def exit_body(rank, world_size, out_dir):
    assert "shardtensor" not in sys.modules, "the check below must run after shardtensor's own exit handler"

    def record():  # atexit runs handlers last-in first-out: this one after shardtensor's
        with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
            f.write(str(_gloo_workers()))

    atexit.register(record)
    import torch
    import torch.distributed as dist

    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    import torch.distributed.nn  # noqa: F401  binds the live world group as default arguments

    gathered = [None] * world_size
    dist.all_gather_object(gathered, rank, group=mesh.get_group())
    assert gathered == list(range(world_size))
    x = st.distribute_tensor(torch.arange(6.0), mesh, [st.Shard(0)])
    assert torch.equal(x.full_tensor(), torch.arange(6.0))
    assert _gloo_workers() > 0, "no Gloo worker threads seen: this check cannot tell anything"
    dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 3])
def test_world_group_freed_before_interpreter_exit(world_size, tmp_path):
    # Fresh interpreters: the check needs shardtensor imported by the body, and a real exit.
    run_ranks(exit_body, world_size, str(tmp_path), start_method="spawn")
    left = {r: int((tmp_path / f"rank{r}").read_text()) for r in range(world_size)}
    assert left == {r: 0 for r in range(world_size)}, f"Gloo worker threads alive at interpreter exit: {left}"
