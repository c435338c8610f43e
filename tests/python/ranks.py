"""Runs a test body on N local ranks, each a fresh process, and reports every rank's failure.

    def body(rank, world_size): ...          # a module-level function of a test file
    run_ranks(body, world_size=3)

Each rank gets the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT on a free port), and SHARDTENSOR_TIMEOUT_S so that a collective that a broken test
leaves waiting raises within seconds. The parent waits at most `timeout` seconds, kills what is
left and fails, so a broken test never hangs CI.

The port is free when the parent picks it, and rank 0's store binds it a moment later; another
job on the machine can take it in between. A run whose rank 0 could not serve the store on it
(the store's "already listens on that port" error) is started again on a new port, at most
`PORT_ATTEMPTS` times in all, so a busy machine does not fail a test.

Ranks start from a fork server that has imported torch and shardtensor once, and what
torch.compile loads the first time a process compiles (`COMPILE_MODULES`): a fresh interpreter
spends about 3 s of CPU importing torch and shardtensor and a first compile 3.5 s more, which on
CI's two cores was most of a short multi-rank test. A run that passes its own `env` needs it before
torch and the library are imported, since they read some variables then, unless every variable
it sets is one of `FORKED_RANKS_APPLY`, which a forked rank applies itself. A run that also sets
`LAUNCHER_APPLIES` goes to a launcher for its environment: a fresh interpreter that holds `env`
from its start and forks the ranks from a fork server of its own, started under that
environment, so a test file whose runs all set the same variables pays the imports once, not
once per rank of every run. Any other variable (TORCH_LOGS, SHARDTENSOR_LOG, SHARDTENSOR_ARENA:
state made at import that a fork would share) starts each rank as a fresh interpreter (spawn), as
does `start_method="spawn"`, for a test of what happens at interpreter exit, which a forked rank
never reaches (multiprocessing ends it with os._exit).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import socket
import traceback

COLLECTIVE_TIMEOUT_S = "20"
# What a process's first torch.compile imports (dynamo, AOTAutograd and its partitioner with
# networkx, Inductor's compiler and C++ code generation): loaded once in the fork server.
COMPILE_MODULES = ["torch._dynamo", "torch._functorch.aot_autograd", "torch._functorch.partitioners",
                   "torch._inductor.compile_fx", "torch._inductor.codecache", "torch._inductor.codegen.cpp",
                   "torch._inductor.fx_passes.post_grad", "torch._inductor.fx_passes.joint_graph"]
# The variables a forked rank can still apply: SHARDTENSOR_TIMEOUT_S is read when a mesh is made,
# MPLBACKEND when matplotlib is imported (the fork server does not import it); Inductor read
# TORCHINDUCTOR_COMPILE_THREADS when the fork server imported it, so a rank sets the config value
# it became.
FORKED_RANKS_APPLY = frozenset({"TORCHINDUCTOR_COMPILE_THREADS", "SHARDTENSOR_TIMEOUT_S", "MPLBACKEND"})
# The variables a launcher's fork server may hold for its ranks: each is read once per process,
# into a setting that holds no per-process state (the compile mode dynamo is taught when it
# loads, whether peer memory is probed), so a forked rank behaves as a fresh one would.
LAUNCHER_APPLIES = frozenset({"SHARDTENSOR_COMPILE", "SHARDTENSOR_PEER_MEMORY"})
PORT_ATTEMPTS = 3
# What rank 0 raises when its store cannot bind the port (src/comm/c10d_mesh.cpp), and what a
# rank that reached another job's store instead raises.
_PORT_TAKEN = ("Another process already listens on that port", "is a second job using the same", "EADDRINUSE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(body, rank, world_size, port, extra_env, args, errors, forked=False):
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "SHARDTENSOR_TIMEOUT_S": COLLECTIVE_TIMEOUT_S, "SHARDTENSOR_STRICT": "1",
    })
    extra_env = dict(extra_env)
    if world_size > 2:
        # Inductor compiles C++ kernels in a pool of worker processes by default. Beside up to
        # two ranks on CI's two cores the pool keeps a core busy that would idle (four models
        # compiled at 2 ranks: 68 s with it, 71 s without); beside more it only adds processes
        # (128 s with it, 124 s without at 4 ranks).
        extra_env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    os.environ.update(extra_env)
    if forked and "TORCHINDUCTOR_COMPILE_THREADS" in extra_env:
        import torch._inductor.config

        torch._inductor.config.compile_threads = int(extra_env["TORCHINDUCTOR_COMPILE_THREADS"])
    if world_size > 1 and "OMP_NUM_THREADS" not in extra_env:
        # The ranks share the cores, as the demo's do (examples/heat_unet_demo.py): with torch's
        # default of a thread per core each, their OpenMP threads spin-wait for cores other ranks
        # hold (a 4-rank test of 100 small training steps on 2 cores: 21.5 s, 2.9 s shared).
        import torch

        threads = max(1, (os.cpu_count() or 1) // world_size)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # and for what the rank starts
        torch.set_num_threads(threads)
    try:
        body(rank, world_size, *args)
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent
        errors.put((rank, traceback.format_exc()))
        raise SystemExit(1)
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
        if forked:
            # What a process's exit runs (shardtensor releases its communicators), which
            # multiprocessing skips for a forked child: it ends with os._exit.
            import atexit

            atexit._run_exitfuncs()


def run_ranks(body, world_size: int, *args, timeout: float = 180.0, env: dict | None = None,
              start_method: str = "forkserver") -> None:
    if start_method != "spawn" and env and not set(env) <= FORKED_RANKS_APPLY and \
            set(env) <= FORKED_RANKS_APPLY | LAUNCHER_APPLIES:
        _launcher_for(env).run(body, world_size, args, timeout)
        return
    if start_method == "spawn" or (env and not set(env) <= FORKED_RANKS_APPLY):
        ctx = multiprocessing.get_context("spawn")
    else:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "shardtensor", *COMPILE_MODULES])
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port_taken = _run_once(ctx, body, world_size, args, timeout, env, last_attempt=attempt == PORT_ATTEMPTS)
        if not port_taken:
            return
        print(f"run_ranks: the store's port was taken by another process (attempt {attempt}); "
              "starting the ranks again on a new port")


def _run_once(ctx, body, world_size, args, timeout, env, last_attempt) -> bool:
    """Runs the ranks once; True when they must run again because the port was taken."""
    errors = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(body, r, world_size, port, env or {}, args, errors,
                                                         ctx.get_start_method() == "forkserver"))
             for r in range(world_size)]
    for p in procs:
        p.start()
    import time

    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    reports = []
    while not errors.empty():
        reports.append(errors.get())
    reports.sort()
    message = "".join(f"\n--- rank {r} ---\n{tb}" for r, tb in reports)
    if hung:
        message += f"\nranks {hung} still ran after {timeout} s and were killed"
    codes = [p.exitcode for p in procs]
    if not last_attempt and any(marker in message for marker in _PORT_TAKEN):
        return True
    if message or any(c != 0 for c in codes):
        raise AssertionError(f"{body.__name__} on {world_size} ranks failed (exit codes {codes}):{message}")
    return False


class _Launcher:
    """A process started with `env` that runs `run_ranks` for the parent, one request at a time."""

    # How long past a run's own timeout the parent waits for the launcher's answer: the launcher
    # kills hung ranks at the timeout and answers at once, so only a dead launcher needs this.
    ANSWER_SLACK_S = 60.0

    def __init__(self, env: dict):
        ctx = multiprocessing.get_context("spawn")
        self.env = dict(env)
        self.connection, theirs = ctx.Pipe()
        # Not a daemon: a daemonic process may not start the ranks. _close_launchers ends it.
        self.process = ctx.Process(target=_launcher_main, args=(theirs, self.env), name="run_ranks launcher")
        self.process.start()
        theirs.close()

    def run(self, body, world_size, args, timeout):
        self.connection.send((body, world_size, args, timeout))
        if not self.connection.poll(timeout + self.ANSWER_SLACK_S):
            self.close()
            raise AssertionError(f"{body.__name__} on {world_size} ranks: the launcher for {self.env} did not answer "
                                 f"within {timeout + self.ANSWER_SLACK_S} s and was killed")
        try:
            failure = self.connection.recv()
        except EOFError:
            self.close()
            raise AssertionError(f"{body.__name__} on {world_size} ranks: the launcher for {self.env} died "
                                 f"(exit code {self.process.exitcode})") from None
        if failure:
            raise AssertionError(failure)

    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self):
        try:
            self.connection.send(None)
        except OSError:
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _launcher_main(connection, env):
    os.environ.update(env)  # before this process or its fork server imports torch
    while True:
        request = connection.recv()
        if request is None:
            return
        body, world_size, args, timeout = request
        try:
            run_ranks(body, world_size, *args, timeout=timeout)
            connection.send(None)
        except BaseException as e:  # noqa: BLE001 - the parent raises it
            connection.send(str(e) or repr(e))


_LAUNCHERS: dict = {}


def _launcher_for(env: dict) -> _Launcher:
    key = tuple(sorted(env.items()))
    launcher = _LAUNCHERS.get(key)
    if launcher is None or not launcher.alive():
        launcher = _LAUNCHERS[key] = _Launcher(env)
    return launcher


@atexit.register
def _close_launchers():
    # Registered after multiprocessing's own exit handler, so it runs first: that one joins
    # every child process, and a launcher ends only when asked.
    for launcher in _LAUNCHERS.values():
        launcher.close()
    _LAUNCHERS.clear()
