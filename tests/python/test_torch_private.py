"""shardtensor/_torch_private.py lists every private part of torch the package reaches into:
each entry resolves in the installed torch, and the package's sources name no private torch
module (``torch._x``, ``torch.x._y``) that an entry does not."""

import pathlib
import re

import torch

import shardtensor
from shardtensor import _torch_private

PACKAGE = pathlib.Path(shardtensor.__file__).parent
# A dotted name from torch with a private part: torch._dynamo.guards, torch.distributed._tools.
PRIVATE = re.compile(r"\btorch(?:\.\w+)*\._[a-z]\w*(?:\.\w+)*")


def test_every_listed_reach_resolves_in_this_torch():
    missing = []
    for reach in _torch_private.REACHES:
        try:
            _torch_private.resolve(reach.name)
        except (AttributeError, ImportError) as e:
            missing.append(f"{reach.name} ({reach.where}): {e}")
    assert not missing, f"torch {torch.__version__} lacks what shardtensor reaches into:\n" + "\n".join(missing)


def test_the_sources_reach_no_private_torch_module_the_list_does_not_name():
    listed = [reach.name for reach in _torch_private.REACHES]
    assert len(set(listed)) == len(listed), "an entry is listed twice"
    unlisted = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_torch_private.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for name in PRIVATE.findall(code):
                if name.startswith("torch.ops.") and not any(p.startswith("_") for p in name.split(".")[5:]):
                    continue  # an operator (torch.ops.aten._softmax.default): public by its namespace
                # The private name (torch._dynamo.guards of torch._dynamo.guards.X): some entry
                # must lie under it or above it.
                if not any(entry.startswith(name) or name.startswith(entry) for entry in listed):
                    unlisted.setdefault(name, f"{path.relative_to(PACKAGE)}:{number}")
    for name in list(unlisted):
        if any(name.startswith(public) for public in _torch_private.PUBLIC_UNDER_PRIVATE_NAMES):
            del unlisted[name]
    assert not unlisted, ("private torch names not listed in shardtensor/_torch_private.py:\n"
                          + "\n".join(f"{n} ({where})" for n, where in sorted(unlisted.items())))
