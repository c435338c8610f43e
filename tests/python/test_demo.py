"""The README's Python demo: the sharded U-Net stays within 1e-4 of one process and writes its
four figures (a short run on a 2 x 2 mesh, which splits H and W unevenly); with --dp, the same
under torch's DDP over a "dp" mesh axis with plain weights."""

import os
import subprocess
import sys

import pytest

from ranks import run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_demo(tmp_path, *options):
    """The demo on 4 local ranks, under the package's launcher (each rank a fresh interpreter, as
    the README runs it); fails the test with its output when it exits non-zero."""
    shardrun = os.path.join(os.path.dirname(sys.executable), "shardrun")
    demo = os.path.join(REPO, "examples", "heat_unet_demo.py")
    env = dict(os.environ, SHARDTENSOR_TIMEOUT_S="60", SHARDTENSOR_STRICT="1", MPLBACKEND="Agg")
    result = subprocess.run([shardrun, "-n", "4", sys.executable, demo, *options, "--out", str(tmp_path)],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


def demo_rank(rank, world_size, argv, expected):
    """One rank of the demo's main(argv), in a rank forked from the test ranks' fork server: it
    must return 0, and rank 0, which prints, must print `expected`."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location("heat_unet_demo", os.path.join(REPO, "examples", "heat_unet_demo.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = demo.main(argv)
    out = printed.getvalue()
    assert code == 0, f"the demo returned {code}:\n{out[-4000:]}"
    assert rank != 0 or expected in out, f"rank 0 did not print {expected!r}:\n{out[-2000:]}"


def run_demo_forked(tmp_path, *options, expected):
    """The demo on 4 local ranks forked from the fork server, which has imported torch and what
    torch.compile loads: a fresh interpreter per rank spent about 3 s of CPU on those imports
    and 3.5 s more on a first compile's. run_demo covers the launcher."""
    run_ranks(demo_rank, 4, [*options, "--out", str(tmp_path)], expected, timeout=600,
              env={"SHARDTENSOR_TIMEOUT_S": "60", "MPLBACKEND": "Agg"})


def test_python_demo_matches_one_process_and_writes_figures(tmp_path):
    run_demo(tmp_path, "--mesh", "2x2", "--steps", "3")
    for name in ("target_field.png", "predicted_field.png", "error_field.png", "loss_curves.png"):
        path = tmp_path / name
        assert path.exists() and path.stat().st_size > 10_000, f"{name} missing or empty"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG"


def test_python_demo_data_parallel_times_domain_parallel(tmp_path):
    """--dp 2: plain weights, torch's DDP over "dp" times H split over "domain" (PhysicsNeMo's
    recipe), within 1e-4 of one process stepping on the mean of the two groups' losses."""
    run_demo_forked(tmp_path, "--dp", "2", "--steps", "2", expected="DDP over dp=2 x H split over domain=2")


@pytest.mark.parametrize("options", [["--mesh", "2x2"], ["--dp", "2"], ["--dp", "2", "--fsdp"]],
                         ids=["H_and_W_split", "ddp", "fsdp2"])
def test_python_demo_under_torch_compile(tmp_path, options):
    """--compile: the sharded model (and DDP or FSDP2 around it) under torch.compile, within 1e-4
    of one process (the demo exits non-zero otherwise); operators on ShardTensors run eagerly."""
    run_demo_forked(tmp_path, *options, "--compile", "--steps", "2", expected=", compiled")
