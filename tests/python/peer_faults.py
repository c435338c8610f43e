"""The protocol of the tests in which one rank dies or stops in the middle of a step
(test_ddp_faults.py, test_fsdp_faults.py, test_compile_traced.py).

The failing rank calls `fail(out_dir, fault)`: "dies" leaves at once; "stops" stops itself
(SIGSTOP) until rank 0 has written its report, then leaves. Every other rank runs the step,
writes what happened with `report_and_leave(out_dir, rank, fault, *fields)` (one line a field),
and leaves without the exit handlers' collectives; rank 0 first wakes the stopped rank. The
parent reads the reports (`read_report`), and the failing rank writes none.
"""

from __future__ import annotations

import os
import signal
import threading

# The collective timeout of these tests' ranks (run_ranks(..., env=FAULT_ENV)): shorter than
# ranks.py's, since a survivor of a stopped peer waits it out, and nothing else waits on it: the
# healthy step is over on every rank (a barrier) before the fault.
FAULT_TIMEOUT_S = 8
FAULT_ENV = {"SHARDTENSOR_TIMEOUT_S": str(FAULT_TIMEOUT_S)}
# How long a survivor may take to raise: the collective timeout, and some slack for a loaded machine.
RAISE_LIMIT_S = FAULT_TIMEOUT_S + 15


def fail(out_dir: str, fault: str) -> None:
    if fault == "stops":  # until rank 0 has its report; then it leaves
        with open(os.path.join(out_dir, "stopped.pid"), "w") as f:
            f.write(str(os.getpid()))
        # To this thread, not the process: a process-directed SIGSTOP may be taken by another
        # thread (the main one, when a background thread fails), and the caller would run on
        # into os._exit before the stop reached it: the rank would die, not stop.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    os._exit(0)  # the parent checks the other ranks' reports, not this exit code


def report_and_leave(out_dir: str, rank: int, fault: str, *fields) -> None:
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write("".join(f"{field}\n" for field in fields))
    if rank == 0 and fault == "stops":
        with open(os.path.join(out_dir, "stopped.pid")) as f:
            os.kill(int(f.read()), signal.SIGCONT)
    os._exit(0)  # the group is broken: leave without the exit handlers' collectives


def read_report(out_dir, rank: int) -> list[str]:
    with open(os.path.join(out_dir, f"rank{rank}")) as f:
        return f.read().splitlines()


def assert_survivors_raised_and_kept_their_parameters(out_dir, world_size: int, fault: str) -> None:
    """For reports of (seconds, parameters unchanged 0/1, outcome): every rank but the last
    raised within the limit and left its parameters as they were; the last wrote nothing."""
    dead = world_size - 1
    for rank in range(dead):
        took, unchanged, outcome = read_report(out_dir, rank)
        assert outcome.startswith("raised"), f"rank {rank} finished the step although rank {dead} {fault}: {outcome}"
        assert float(took) <= RAISE_LIMIT_S, f"rank {rank} raised after {took} s (limit {RAISE_LIMIT_S} s): {outcome}"
        assert unchanged == "1", f"rank {rank} changed its parameters although rank {dead} {fault} ({outcome})"
    assert not os.path.exists(os.path.join(out_dir, f"rank{dead}"))
