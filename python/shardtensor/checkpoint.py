"""Distributed checkpoint: save a state from any layout, load it into any other.

    import shardtensor.checkpoint as ckpt
    ckpt.save({"model": model.state_dict(), "optim": opt.state_dict()}, "run/step-100")
    ...
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    ckpt.load(state, "run/step-100")       # fills the tensors in place, in their own layouts
    opt.load_state_dict(state["optim"])    # Python numbers were written back into `state`

`state` is a dict, possibly nested (dicts, lists, tuples), whose leaves are ShardTensors, plain
tensors and Python numbers (int, float, bool). Keys are joined with "." ("optim.state.0.exp_avg").
Leaves that are None or str carry no data (an optimizer's "foreach": None): they are neither
saved nor loaded. Loading fills tensors in place; a number, being immutable, is replaced in its
dict or list. Tuples hold numbers that cannot be replaced (Adam's betas): they are loaded only
to be checked against what the state holds.

Both calls are collective over the ranks of the state's ShardTensors (or `mesh`). The format, the
atomicity of a save, and what a load checks before it writes anything are in docs/checkpoint.md
("Format"): the same C++ code runs for C++ programs.
"""

from __future__ import annotations

import torch

from . import _C
from ._mesh import DeviceMesh

__all__ = ["AsyncSave", "load", "save", "save_async"]

_NUMBER_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64}


def _flatten(state, prefix: str, out: dict, numbers: dict) -> None:
    """Tensors and numbers of `state` under their dotted keys; `numbers` maps a number's key to
    (its container, its index) so that load can write it back."""
    items = state.items() if isinstance(state, dict) else enumerate(state)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, torch.Tensor):
            out[name] = value
        elif isinstance(value, (dict, list, tuple)):
            _flatten(value, name + ".", out, numbers)
        elif type(value) in _NUMBER_DTYPES:
            out[name] = torch.tensor(value, dtype=_NUMBER_DTYPES[type(value)])
            numbers[name] = (state, key)
        elif value is None or isinstance(value, str):
            continue
        else:
            raise TypeError(f"checkpoint: '{name}' is a {type(value).__name__}; a state holds tensors, Python numbers "
                            f"(int, float, bool), and dicts, lists or tuples of them (None and str are skipped)")


def _cpp_mesh(mesh: DeviceMesh | None):
    if mesh is None:
        return None
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"checkpoint: mesh must be a shardtensor DeviceMesh or None, got {type(mesh).__name__}")
    return mesh._cpp


def _flat(state) -> tuple[dict, dict]:
    if not isinstance(state, dict):
        raise TypeError(f"checkpoint: state must be a dict (name -> tensor, number or nested dict), "
                        f"got {type(state).__name__}")
    flat, numbers = {}, {}
    _flatten(state, "", flat, numbers)
    return flat, numbers


def save(state: dict, path: str, *, mesh: DeviceMesh | None = None, fsync: bool = True) -> None:
    """Writes `state` to the directory `path` atomically; every element once, by one rank."""
    flat, _ = _flat(state)
    _C.checkpoint_save(flat, str(path), _cpp_mesh(mesh), fsync)


class AsyncSave:
    """A save whose files are written in the background; `wait()` (collective) publishes it."""

    def __init__(self, handle):
        self._handle = handle

    def wait(self) -> None:
        self._handle.wait()

    @property
    def pending(self) -> bool:
        return self._handle.pending


def save_async(state: dict, path: str, *, mesh: DeviceMesh | None = None, fsync: bool = True) -> AsyncSave:
    """Returns once every rank has copied its boxes: the tensors may change right away."""
    flat, _ = _flat(state)
    return AsyncSave(_C.checkpoint_save_async(flat, str(path), _cpp_mesh(mesh), fsync))


def load(state: dict, path: str, *, strict: bool = True, mesh: DeviceMesh | None = None):
    """Fills `state` from the checkpoint at `path`, each tensor in the layout it already has.

    Returns (missing_keys, unexpected_keys); with strict=True (the default) either raises on
    every rank, before anything is written."""
    flat, numbers = _flat(state)
    missing, unexpected = _C.checkpoint_load(flat, str(path), strict, _cpp_mesh(mesh))
    skipped = set(missing)
    for name, (container, key) in numbers.items():
        if name in skipped:
            continue
        value = type(container[key])(flat[name].item())
        if isinstance(container, tuple):
            if value != container[key]:
                raise ValueError(f"checkpoint: '{name}' is {value} in {path} but {container[key]} in the state, and it "
                                 f"sits in a tuple that load cannot change; build the state with the saved value")
            continue
        container[key] = value
    return missing, unexpected
