"""CommDebugMode: the collectives shardtensor issues, counted in C++, and DTensor's module view of
them (forward and backward counts per module, parameter and sharding info, the tracing table and
its JSON dump), with the bytes each rank sent as shardtensor's addition.

The counts come from the C++ counter (no Python runs per operator). Modules are followed by
torch's own ModTracker (module pre/post hooks, gradient hooks in backward); at every module
boundary the counts since the last boundary are added to every module running then, so a
module's counts include its children's, as in DTensor. What runs outside every module counts
for "Global" only, in the pass that is running at the next boundary.
"""

from __future__ import annotations

import functools
import json
import sys

import torch

from . import _C


def _add(into: dict, delta: dict) -> None:
    for key, value in delta.items():
        into[key] = into.get(key, 0) + value


def _minus(now: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


@functools.lru_cache(maxsize=None)
def _module_comm_tracker_class():
    """The tracker class, made on first use: torch's ModTracker module imports torch._dynamo (900
    modules), which `import shardtensor` should not pay for, nor its exit."""
    from torch.distributed._tools.mod_tracker import ModTracker

    return type("_ModuleCommTracker", (_ModuleCommTrackerMixin, ModTracker), {})


class _ModuleCommTrackerMixin:
    """Over torch's ModTracker: the counter's increments go to the modules running."""

    def __init__(self, counter):
        super().__init__()
        self._counter = counter
        self._last_counts, self._last_ops, self._last_bytes = {}, {}, 0
        self.module_counts: dict[str, dict] = {}
        self.module_types: dict[str, str] = {"Global": "Global"}
        self.module_depth: dict[str, int] = {"Global": 0}
        self.module_parameters: dict[str, dict[str, torch.Tensor]] = {}
        self.children: dict[str, list[str]] = {"Global": []}
        self._entry("Global")

    def _entry(self, name: str) -> dict:
        return self.module_counts.setdefault(name, {
            "forward": {}, "backward": {}, "forward_operators": {}, "backward_operators": {},
            "forward_bytes": 0, "backward_bytes": 0})

    def flush(self) -> None:
        """Adds what the counter counted since the last call to every module running now."""
        self._counter.snapshot()
        counts, ops, sent = dict(self._counter.counts), {o: dict(k) for o, k in self._counter.by_operator.items()}, self._counter.bytes
        delta = _minus(counts, self._last_counts)
        op_delta = {o: d for o, d in ((o, _minus(k, self._last_ops.get(o, {}))) for o, k in ops.items()) if d}
        bytes_delta = sent - self._last_bytes
        self._last_counts, self._last_ops, self._last_bytes = counts, ops, sent
        if not delta and not bytes_delta:
            return
        phase = "backward" if self.is_bw else "forward"
        for name in self.parents | {"Global"}:
            entry = self._entry(name)
            _add(entry[phase], delta)
            for op, kinds in op_delta.items():
                _add(entry[phase + "_operators"].setdefault(op, {}), kinds)
            entry[phase + "_bytes"] += bytes_delta

    def _flushing_first(self, change_parents):
        """`change_parents`, after the counts so far are given to the modules running now."""
        def fn(*args):
            self.flush()
            return change_parents(*args)

        return fn

    def _get_append_fn(self, w_mod, name, is_bw):
        return self._flushing_first(super()._get_append_fn(w_mod, name, is_bw))

    def _get_pop_fn(self, w_mod, name, is_bw):
        pop = self._flushing_first(super()._get_pop_fn(w_mod, name, is_bw))

        def fn(*args):
            # A module whose pre-hook a compiled graph skipped (below) and whose post-hook runs
            # eagerly after a graph break was never pushed: nothing to pop.
            if is_bw or name in self.parents:
                pop(*args)

        return fn

    def _fw_post_hook(self, mod, input, output):
        if torch.compiler.is_compiling():
            return
        return super()._fw_post_hook(mod, input, output)

    def _fw_pre_hook(self, mod, input):
        # As torch's: a compiled module's submodules are not tracked (their counts go to its
        # parents); nor is a module that dynamo traces (the counter it flushes is C++).
        if torch._dynamo.eval_frame._is_in_optimized_module() or torch.compiler.is_compiling():
            return
        name = self._get_mod_name(mod)
        if name not in self.module_types:  # the first forward call names it and its parameters
            self.module_types[name] = type(mod).__name__
            self.module_depth[name] = name.count(".") + 1
            parent = name.rsplit(".", 1)[0] if "." in name else "Global"
            self.children.setdefault(parent if parent in self.module_types else "Global", []).append(name)
            self.children.setdefault(name, [])
            self.module_parameters[name] = dict(mod.named_parameters(recurse=False))
            self._entry(name)
        return super()._fw_pre_hook(mod, input)


class CommDebugMode:
    """Counts the collectives shardtensor issues on this thread, as DTensor's CommDebugMode.

        with CommDebugMode() as comm_mode:
            loss = model(x).sum()
            loss.backward()
        comm_mode.get_comm_counts()                       # {"all_reduce": 2}
        comm_mode.comm_module_counts["Model.layer1"]      # {"forward": {...}, "backward": {...}}
        print(comm_mode.generate_comm_debug_tracing_table(noise_level=1))

    Kinds are named as c10d's collectives ("all_reduce", "all_gather", "all_to_all", ...);
    get_comm_counts_by_operator() and table() give them per ATen operator. Module names are
    torch's ModTracker's ("Model", "Model.layer1"); "Global" holds everything.
    """

    def __init__(self):
        self._counter = _C.CommCounter()
        self._tracker = _module_comm_tracker_class()(self._counter)

    def __enter__(self):
        self._counter.start()
        self._tracker.__enter__()
        return self

    def __exit__(self, *exc):
        # fully_shard's prefetched gathers started in the block count in it, as they would run
        # in the block on the thread that started them (fsdp/_prefetch.py); and the counter they
        # add to must outlive them.
        prefetch = sys.modules.get("shardtensor.fsdp._prefetch")
        if prefetch is not None:
            prefetch.STREAM.drain()
        self._tracker.flush()
        self._tracker.__exit__(*exc)
        self._counter.stop()
        return False

    def _now(self):
        self._counter.snapshot()
        return self._counter

    # ---- counts, as DTensor's ------------------------------------------------------------

    def get_total_counts(self) -> int:
        return self._now().total

    def get_comm_counts(self) -> dict[str, int]:
        return dict(self._now().counts)

    def get_comm_counts_by_operator(self) -> dict[str, dict[str, int]]:
        return {op: dict(kinds) for op, kinds in self._now().by_operator.items()}

    def get_bytes(self) -> int:
        """Bytes this rank sent to other ranks."""
        return self._now().bytes

    def table(self) -> str:
        """One row per operator and collective kind."""
        return self._now().table

    @property
    def comm_module_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """{module: {"forward": {collective: count}, "backward": {...}}}, children included."""
        self._tracker.flush()
        return {name: {"forward": dict(c["forward"]), "backward": dict(c["backward"])}
                for name, c in self._tracker.module_counts.items()}

    def get_module_bytes(self) -> dict[str, dict[str, int]]:
        """{module: {"forward": bytes, "backward": bytes}} this rank sent (shardtensor's addition)."""
        self._tracker.flush()
        return {name: {"forward": c["forward_bytes"], "backward": c["backward_bytes"]}
                for name, c in self._tracker.module_counts.items()}

    def get_parameter_info(self) -> dict[str, dict[str, torch.Tensor]]:
        """{module: {parameter name: parameter}} for every module that ran a forward."""
        return {name: dict(params) for name, params in self._tracker.module_parameters.items() if params}

    def get_sharding_info(self) -> dict[str, tuple]:
        """{"module.parameter": placements} for every sharded parameter of a module that ran."""
        info = {}
        for name, params in self._tracker.module_parameters.items():
            for pname, p in params.items():
                if _C.is_shard_tensor(p):
                    info[f"{name}.{pname}"] = p.placements
        return info

    # ---- the tracing table and its JSON ---------------------------------------------------

    def _tree(self, noise_level: int) -> dict:
        self._tracker.flush()
        t = self._tracker

        def node(name: str) -> dict:
            c = t._entry(name)
            out = {"fqn": name, "module_type": t.module_types.get(name, ""),
                   "forward": dict(c["forward"]), "backward": dict(c["backward"]),
                   "forward_bytes": c["forward_bytes"], "backward_bytes": c["backward_bytes"]}
            if noise_level >= 1:
                out["parameters"] = {p: (str(tuple(v.placements)) if _C.is_shard_tensor(v) else "plain")
                                     for p, v in t.module_parameters.get(name, {}).items()}
            if noise_level >= 2:
                out["forward_operators"] = {o: dict(k) for o, k in c["forward_operators"].items()}
                out["backward_operators"] = {o: dict(k) for o, k in c["backward_operators"].items()}
            out["children"] = [node(child) for child in t.children.get(name, [])]
            return out

        return node("Global")

    def generate_comm_debug_tracing_table(self, noise_level: int = 3) -> str:
        """The modules as a tree, each with its collectives per pass and the bytes this rank
        sent. noise_level 0: collectives; 1: and the parameters' placements; 2 and 3: and the
        operators that issued them (every operator is C++'s, so 3 adds nothing to 2)."""
        _check_noise_level(noise_level)
        lines = []

        def emit(n: dict, depth: int) -> None:
            pad = "  " * depth
            lines.append(f"{pad}{n['fqn']}" + (f" ({n['module_type']})" if n["module_type"] not in ("", "Global") else ""))
            if noise_level >= 1:
                for p, placements in n.get("parameters", {}).items():
                    lines.append(f"{pad}  parameter {p}: {placements}")
            for phase in ("forward", "backward"):
                if not n[phase]:
                    continue
                lines.append(f"{pad}  {phase.upper()} PASS ({n[phase + '_bytes']} bytes sent by this rank)")
                for kind, count in sorted(n[phase].items()):
                    lines.append(f"{pad}    {kind}: {count}")
                if noise_level >= 2:
                    for op, kinds in sorted(n.get(phase + "_operators", {}).items()):
                        lines.append(f"{pad}    {op}: " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())))
            for child in n["children"]:
                emit(child, depth + 1)

        emit(self._tree(noise_level), 0)
        return "\n".join(lines) + "\n"

    def generate_json_dump(self, file_name: str = "comm_mode_log.json", noise_level: int = 3) -> None:
        """The tree of generate_comm_debug_tracing_table as JSON, in `file_name`."""
        _check_noise_level(noise_level)
        with open(file_name, "w") as f:
            json.dump(self._tree(noise_level), f, indent=2)

    def log_comm_debug_tracing_table_to_file(self, file_name: str = "comm_mode_log.txt", noise_level: int = 3) -> None:
        """generate_comm_debug_tracing_table, appended to `file_name`."""
        with open(file_name, "a") as f:
            f.write(self.generate_comm_debug_tracing_table(noise_level))


def _check_noise_level(noise_level) -> None:
    if isinstance(noise_level, bool) or not isinstance(noise_level, int) or not 0 <= noise_level <= 3:
        raise ValueError(f"noise_level must be 0, 1, 2 or 3, got {noise_level!r}")
