"""torch.compile on ShardTensors: by default, what touches one runs eagerly, behind a graph break;
with SHARDTENSOR_COMPILE=trace (experimental), ShardTensors are traced (_compile_trace.py).

dynamo traces a tensor subclass only through Python's traceable-wrapper protocol
(``__tensor_flatten__``). A ShardTensor is a plain ``torch.Tensor`` whose TensorImpl is
shardtensor's C++ one, so dynamo would convert it to a fake tensor as if it were dense: that reads
a storage the ShardTensor does not have (the crash "Cannot access storage of TensorImpl"), and a
fake tensor of the global shape would lose the layout. torch treats its own storage-less C++
tensors (sparse ones) in the same place the same way: ``VariableBuilder.wrap_tensor`` refuses
them with a graph break. shardtensor adds ShardTensors to that refusal, so that under
``torch.compile`` (any backend) and ``torch._dynamo.explain``:

- plain-tensor work in a compiled function is compiled, in the graphs between the breaks;
- every operator on a ShardTensor runs through shardtensor's C++ dispatcher exactly as in eager
  mode: the same values, gradients and collectives, on any layout;
- ``fullgraph=True`` raises torch's ``Unsupported`` error, which names the ShardTensor and says
  what to do instead (or names the shardtensor function it met: dynamo skips those, below);
- ``TORCH_LOGS=graph_breaks`` prints the reason at each break.

The computation on each rank's piece does compile: ``local_map(torch.compile(fn), ...)`` runs a
compiled ``fn`` on plain local tensors, and the collectives stay in C++.

dynamo is taught this when ``torch._dynamo`` is first imported (shardtensor does not import dynamo
itself: it takes a second, and it binds ``torch.distributed.nn``'s defaults to the world group).
"""

from __future__ import annotations

import os
import warnings

import torch

from . import _C
from ._after_import import after_import

_DYNAMO = "torch._dynamo"
_EXPLANATION = (
    "a ShardTensor is a C++ tensor that dynamo cannot trace yet, so the operators on it run eagerly "
    "through shardtensor's C++ dispatcher (the same values, gradients and collectives as without "
    "torch.compile); plain-tensor work around them is still compiled")
_HINTS = [
    "Use fullgraph=False (the default): the sharded operators then run eagerly between compiled graphs.",
    "To compile the work on each rank's piece, compile a function of plain tensors and apply it with "
    "shardtensor.local_map(torch.compile(fn), out_placements, in_placements).",
    "To trace the sharded operators into the graph (fullgraph=True included), set SHARDTENSOR_COMPILE=trace in "
    "the environment before torch._dynamo is imported (experimental; docs/python.md, \"torch.compile\").",
]
_warned = False


def _source_name(builder) -> str:
    source = builder.get_source()
    name = getattr(source, "name", None)
    return name() if callable(name) else str(name if name is not None else source)


def _describe(value) -> str:
    try:
        return f"a ShardTensor of global shape {tuple(value.shape)} with placements {value.placements}"
    except Exception:  # noqa: BLE001 - the description is only context for the message
        return "a ShardTensor"


def _warn_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn("torch.compile: " + _EXPLANATION + " (each such operator is a graph break; "
                      "TORCH_LOGS=graph_breaks lists them; SHARDTENSOR_COMPILE=trace traces them instead)", stacklevel=1)


def traces() -> bool:
    """Whether torch.compile traces ShardTensors (SHARDTENSOR_COMPILE=trace, read when dynamo
    loads) instead of running their operators eagerly between graphs (the default)."""
    mode = os.environ.get("SHARDTENSOR_COMPILE", "eager")
    if mode not in ("eager", "trace"):
        raise ValueError(f"SHARDTENSOR_COMPILE={mode!r}: allowed are 'eager' (the default: operators on ShardTensors "
                         f"run eagerly between compiled graphs) and 'trace' (they are traced into the graph)")
    return mode == "trace"


def _teach(dynamo) -> None:
    if traces():
        from . import _compile_trace

        missing = _compile_trace.missing_support(dynamo)
        if missing is None:
            _compile_trace.teach(dynamo)
            return
        warnings.warn(f"SHARDTENSOR_COMPILE=trace: torch {torch.__version__} lacks {missing}, which tracing "
                      f"ShardTensors needs; their operators run eagerly behind graph breaks instead, as in the "
                      f"default mode (the same values)")
    _teach_graph_breaks(dynamo)


def _teach_graph_breaks(dynamo) -> None:
    """Makes dynamo run shardtensor's own functions eagerly, and refuse ShardTensors as it
    refuses sparse tensors."""
    # shardtensor's functions build and inspect ShardTensors through its C++ extension: traced,
    # each would break at its first line anyway, after dynamo had guessed at its arguments (a
    # DeviceMesh is opaque to it).
    dynamo.trace_rules.add(__name__.split(".")[0])
    cls = dynamo.variables.builder.VariableBuilder
    original = cls.wrap_tensor
    if getattr(original, "_refuses_shard_tensors", False):
        return
    from torch._dynamo.exc import unimplemented

    def wrap_tensor(self, value):
        if _C.is_shard_tensor(value):
            _warn_once()
            unimplemented(
                gb_type="Attempted to wrap a ShardTensor",
                context=f"{_source_name(self)}: {_describe(value)}",
                explanation=_EXPLANATION,
                hints=_HINTS,
            )
        return original(self, value)

    wrap_tensor._refuses_shard_tensors = True
    cls.wrap_tensor = wrap_tensor


def _teach_or_warn(dynamo) -> None:
    try:
        _teach(dynamo)
    except Exception as e:  # noqa: BLE001 - another torch's dynamo: compile as it would without us
        warnings.warn(f"shardtensor could not teach this torch's dynamo to leave ShardTensors to eager mode "
                      f"({type(e).__name__}: {e}); torch.compile on ShardTensors may fail")


def install() -> None:
    """Teaches dynamo now if it is loaded, else as soon as it is."""
    after_import(_DYNAMO, _teach_or_warn)
