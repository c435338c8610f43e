"""torch.compile on ShardTensors: traced by default (_compile_trace.py), every sharded operator
and every move an operator of the graph, as DTensor is traced; with SHARDTENSOR_COMPILE=eager
(the opt-out), what touches a ShardTensor runs eagerly behind a graph break instead.

dynamo traces a tensor subclass only through Python's traceable-wrapper protocol
(``__tensor_flatten__``). A ShardTensor is a plain ``torch.Tensor`` whose TensorImpl is
shardtensor's C++ one, so dynamo would convert it to a fake tensor as if it were dense: that reads
a storage the ShardTensor does not have (the crash "Cannot access storage of TensorImpl"), and a
fake tensor of the global shape would lose the layout. So dynamo is taught, when it loads, one of
two things:

- traced (the default): it takes each ShardTensor as its local piece plus its layout, a constant
  of the trace (_compile_trace.py); ``fullgraph=True`` works, and a region that cannot be traced
  (an operator without a sharding rule after decomposition, a plain weight that requires grad
  beside a ShardTensor) breaks the graph with a reason ``torch._dynamo.explain`` shows;
- eager (SHARDTENSOR_COMPILE=eager, or a torch without what tracing needs): torch treats its own
  storage-less C++ tensors (sparse ones) the same way, ``VariableBuilder.wrap_tensor`` refusing
  them with a graph break. Plain-tensor work is compiled in the graphs between the breaks, every
  operator on a ShardTensor runs through shardtensor's C++ dispatcher as in eager mode, and
  ``fullgraph=True`` raises torch's ``Unsupported`` error naming the ShardTensor.

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
    "ShardTensors are not traced here (SHARDTENSOR_COMPILE=eager, or a torch without what tracing needs), so "
    "the operators on them run eagerly through shardtensor's C++ dispatcher (the same values, gradients and "
    "collectives as without torch.compile); plain-tensor work around them is still compiled")
_HINTS = [
    "Use fullgraph=False (the default): the sharded operators then run eagerly between compiled graphs.",
    "To compile the work on each rank's piece, compile a function of plain tensors and apply it with "
    "shardtensor.local_map(torch.compile(fn), out_placements, in_placements).",
    "To trace the sharded operators into the graph (fullgraph=True included), leave SHARDTENSOR_COMPILE unset "
    "(or set it to 'trace') before torch._dynamo is imported (docs/python.md, \"torch.compile\").",
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
                      "TORCH_LOGS=graph_breaks lists them)", stacklevel=1)


def traces() -> bool:
    """Whether torch.compile traces ShardTensors (the default) or runs their operators eagerly
    between compiled graphs (SHARDTENSOR_COMPILE=eager); read when dynamo loads."""
    mode = os.environ.get("SHARDTENSOR_COMPILE", "trace")
    if mode not in ("eager", "trace"):
        raise ValueError(f"SHARDTENSOR_COMPILE={mode!r}: allowed are 'trace' (the default: operators on ShardTensors "
                         f"are traced into the graph) and 'eager' (they run eagerly between compiled graphs)")
    return mode == "trace"


def _teach(dynamo) -> None:
    if traces():
        from . import _compile_trace

        missing = _compile_trace.missing_support(dynamo)
        if missing is None:
            _compile_trace.teach(dynamo)
            return
        warnings.warn(f"torch.compile: torch {torch.__version__} lacks {missing}, which tracing ShardTensors "
                      f"needs; their operators run eagerly behind graph breaks instead, as with "
                      f"SHARDTENSOR_COMPILE=eager (the same values)")
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


class _PythonFunction(torch.autograd.Function):
    """Any Python autograd Function: its node shows the C++ library the class of such nodes."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _show_compiled_regions() -> None:
    """Lets the C++ dispatch tell a compiled region's autograd node (AOTAutograd's
    CompiledFunction, a Python autograd Function) from others: the regions' backward kernels
    read data pointers, so the gradients of their outputs that meet ShardTensors are handed in
    whole (dispatch/plain_gradients.cpp)."""
    with torch.enable_grad():  # dynamo may first load under no_grad
        _C.learn_python_function_node(_PythonFunction.apply(torch.zeros((), requires_grad=True)))


def _teach_or_warn(dynamo) -> None:
    _show_compiled_regions()
    try:
        _teach(dynamo)
    except Exception as e:  # noqa: BLE001 - another torch's dynamo: compile as it would without us
        warnings.warn(f"shardtensor could not teach this torch's dynamo to leave ShardTensors to eager mode "
                      f"({type(e).__name__}: {e}); torch.compile on ShardTensors may fail")


def install() -> None:
    """Teaches dynamo now if it is loaded, else as soon as it is."""
    after_import(_DYNAMO, _teach_or_warn)
