"""Every private part of torch that shardtensor reaches into, with the reason, in one place.

torch's public API does not cover what a C++ tensor subclass needs from dynamo, or where torch's
checkpoint and data-parallel code test types instead of protocols. Each entry below names the
attribute (resolved from ``torch``), how shardtensor uses it (``patched``: replaced by a wrapper
that calls the original; ``called``: used as it is; ``subclassed``), the module that does, and why.
``tests/python/test_torch_private.py`` checks that every entry resolves in the installed torch,
and that the package's sources reach no private torch module this table does not name: a torch
upgrade that moves one fails there, not in a user's step.

Checked on torch 2.15 (every entry) and 2.11 (the GPU machine's: it lacks the constant opaque
types, so tracing falls back to graph breaks with a warning: ``_compile_trace.missing_support``).
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

CHECKED_ON = ("2.15", "2.11")


class Reach(NamedTuple):
    name: str  # dotted, from torch
    how: str  # "patched", "called" or "subclassed"
    where: str  # the shardtensor module
    why: str


REACHES = (
    # ---- torch.compile: tracing ShardTensors (_compile_trace.py), graph breaks (_compile.py) ----
    Reach("torch._dynamo.variables.builder.VariableBuilder.wrap_tensor", "patched", "_compile_trace, _compile",
          "a ShardTensor is a C++ tensor without storage: dynamo would fake it as dense; it enters a graph as its "
          "piece with the layout a constant (or, opted out, is refused with a graph break)"),
    Reach("torch._dynamo.guards.GuardBuilder.get_guard_manager_from_source", "patched", "_compile_trace",
          "the guard of a ShardTensor argument compares its layout through its piece (_C.PieceGuard)"),
    Reach("torch._dynamo.guards._get_closure_vars", "patched", "_compile_trace",
          "where dynamo evaluates a guard's source by name (its failure reasons) it must know the piece source"),
    Reach("torch._dynamo.variables.tensor.TensorVariable.call_method", "patched", "_compile_trace",
          "shardtensor's methods live on torch.Tensor; on a traced ShardTensor they are inlined from the "
          "traceable class instead of recorded as tensor methods"),
    Reach("torch._dynamo.variables.tensor.TensorVariable.dynamic_getattr", "patched", "_compile_trace",
          "a traced ShardTensor's layout reads as a constant of the trace"),
    Reach("torch._dynamo.output_graph.OutputGraph.call_user_compiler", "patched", "_compile_trace",
          "a graph's ShardTensor results leave it as pieces and are rebuilt around the compiled function"),
    Reach("torch._dynamo.source.ChainedSource", "subclassed", "_compile_trace",
          "the source of a ShardTensor argument's piece (what the frame passes and the guards compare)"),
    Reach("torch._dynamo.bytecode_transformation.create_call_function", "called", "_compile_trace",
          "the piece source's bytecode calls _C.piece_into_graph"),
    Reach("torch._dynamo.variables.builder.wrap_fx_proxy", "called", "_compile_trace",
          "the traced ShardTensor built in the graph from its piece"),
    Reach("torch._dynamo.variables.functions.UserFunctionVariable", "called", "_compile_trace",
          "inlining the traceable class's methods"),
    Reach("torch._dynamo.config.traceable_tensor_subclasses", "called", "_compile_trace",
          "the traceable form is a tensor subclass dynamo must trace into"),
    Reach("torch._dynamo.symbolic_convert.tls", "called", "_traceable",
          "whether dynamo is translating a frame now, where a graph break can still be taken"),
    Reach("torch._dynamo.trace_rules.add", "called", "_compile",
          "opted out of tracing, shardtensor's own functions run eagerly"),
    Reach("torch._dynamo.exc.unimplemented", "called", "_compile, _traceable",
          "graph breaks with a reason torch._dynamo.explain shows"),
    Reach("torch._dynamo.eval_frame._is_in_optimized_module", "called", "_comm_debug",
          "CommDebugMode's module hooks skip a compiled module's submodules, as torch's ModTracker does"),
    Reach("torch._guards.dataclass_with_cached_hash", "called", "_compile_trace",
          "sources are hashed dataclasses, as dynamo's own"),
    Reach("torch._library.opaque_object.register_custom_class", "called", "_compile_trace",
          "meshes, placements and layouts are constants of a trace, compared by value"),
    Reach("torch._library.opaque_object.MemberType", "called", "_compile_trace",
          "which members of those constants traced code may read"),
    Reach("torch._library.effects.EffectType", "called", "_traceable",
          "exchanges of parts are ordered effects: graph passes must not reorder them between ranks"),
    Reach("torch.library._register_effectful_op", "called", "_traceable", "as above"),
    Reach("torch._decomp.decompositions.upsample_compute_output_size", "called", "_traced_composites",
          "upsampling taken whole on a traced ShardTensor needs its output size as torch computes it"),
    Reach("torch.ops.aten.linear.default.py_kernels", "patched", "_traced_composites",
          "composites that eager mode takes whole (upsampling) or decomposes its own way (linear on a split "
          "leading dim) reach a traced ShardTensor the same way"),
    Reach("torch._C._disabled_torch_function_impl", "called", "_traceable",
          "the traceable form has no __torch_function__, as torch's wrapper subclasses"),
    Reach("torch.ops.aten.linear.default._op_dk", "called", "_traced_composites",
          "a composite's own decomposition, run at the dispatch key chosen"),
    # ---- PhysicsNeMo's handler registries (_handlers.py) ----
    Reach("torch._C._dispatch_has_kernel_for_dispatch_key", "called", "_handlers",
          "a handler is registered where the operator has kernels (PhysicsNeMo stores handlers for any operator)"),
    Reach("torch._C._dispatch_find_schema_or_throw", "called", "_handlers",
          "whether the dispatcher knows an operator a handler is registered for"),
    # ---- loss_parallel (parallel/loss.py) ----
    Reach("torch.nn._reduction.legacy_get_string", "called", "parallel/loss",
          "the deprecated size_average and reduce arguments mean what torch's losses take them to mean"),
    # ---- checkpoints and state dicts (_torch_checkpoint.py) ----
    Reach("torch.distributed._state_dict_utils._gather_state_dict", "patched", "_torch_checkpoint",
          "full_state_dict=True tests for DTensor by type; a ShardTensor is gathered the same way"),
    Reach("torch.distributed._state_dict_utils._create_cpu_state_dict", "patched", "_torch_checkpoint",
          "cpu_offload tests for DTensor by type; a ShardTensor's piece is copied the same way"),
    # ---- torch's data parallelism refuses ShardTensor parameters clearly (_data_parallel_guards.py) ----
    Reach("torch.distributed.fsdp._fully_shard._fsdp_init._get_managed_states", "patched", "_data_parallel_guards",
          "torch's FSDP2 would fail deep inside on a ShardTensor parameter; the error names shardtensor's"),
    # ---- fully_shard's prefetch (fsdp/_module.py) ----
    Reach("torch.autograd.Variable._execution_engine.queue_callback", "called", "fsdp._module",
          "runs when the running backward ends, where prefetched gathers nobody took are let go (FSDP2's own "
          "post-backward is queued the same way)"),
    # ---- DTensor interoperation ----
    Reach("torch.distributed.device_mesh._mesh_resources.mesh_stack", "called", "_mesh",
          "`with mesh:` pushes onto torch's mesh stack (DeviceMesh.__enter__); a call that names no mesh means its "
          "innermost mesh, for shardtensor's calls as for DTensor's"),
    Reach("torch.distributed.tensor._ops._math_ops._NormPartial", "subclassed", "_placements",
          "shardtensor's NormPartial compares equal to DTensor's, as its other placements do"),
    Reach("torch.distributed.tensor.DTensor.__torch_function__", "patched", "_dtensor_operands",
          "a DTensor beside a ShardTensor becomes the ShardTensor of its layout (torch leaves the method disabled)"),
    Reach("torch.distributed._tools.mod_tracker.ModTracker", "subclassed", "_comm_debug",
          "CommDebugMode's module view is DTensor's, built on torch's module tracker"),
)


# Named privately, but documented and used as torch's API (tutorials, torch's own docs): not
# reaches into internals.
PUBLIC_UNDER_PRIVATE_NAMES = (
    "torch._dynamo.explain", "torch._dynamo.reset", "torch._logging.set_logs", "torch.utils._pytree",
    "torch.Tensor._make_wrapper_subclass", "torch._C.DispatchKey", "torch._C.DispatchKeySet",
    "torch._ops.OpOverload", "torch._ops.OpOverloadPacket",
)


def resolve(name: str):
    """The object ``name`` (dotted from torch) names, importing its modules; raises
    AttributeError or ImportError where this torch lacks it."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)
