"""Runs a function on a module of torch's as soon as it is imported, without importing it first:
how shardtensor adapts parts of torch that ``import shardtensor`` should not pay to load
(torch._dynamo, torch.distributed.checkpoint's state-dict utilities)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


class _RunAfterImport(importlib.abc.MetaPathFinder):
    """Finds `name` as usual and runs each of `then` on the module once it has loaded."""

    def __init__(self, name: str):
        self.name, self.then = name, []

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            for then in self.then:
                then(module)

        spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, then) -> None:
    """then(module) now if `name` is loaded, else right after its import."""
    if name in sys.modules:
        then(sys.modules[name])
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _RunAfterImport) and f.name == name), None)
    if finder is None:
        finder = _RunAfterImport(name)
        sys.meta_path.insert(0, finder)
    if then not in finder.then:
        finder.then.append(then)
