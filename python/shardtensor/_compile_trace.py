"""torch.compile on ShardTensors, traced (SHARDTENSOR_COMPILE=trace, experimental): every move a
functional collective in the graph.

dynamo traces a tensor subclass only through Python's traceable-wrapper protocol; a ShardTensor
is a C++ tensor. So dynamo is taught, when it loads, to take each ShardTensor it meets (an
argument, a parameter of a module) as its traceable form (_traceable.TraceableShardTensor: the
local piece plus the layout as a constant), rebuilt from the ShardTensor before each call by the
frame's bytecode and compared by the guards, which specialise a graph on the layout (mesh,
placements, every shard size: a call with another split recompiles). A graph's ShardTensor
results come out as ShardTensors again, with their autograd links. Inside the graph, every ATen
operator runs shardtensor's C++ dispatch on the traced pieces, and the moves it makes are
recorded as torch's functional collectives (src/comm/traced_collectives.h), which Inductor can
schedule and overlap with the local work.

What dynamo is taught, and why each is needed:
- wrap_tensor: a ShardTensor is wrapped through a TraceableSource, whose guard and bytecode
  build the traceable form;
- the guard builder learns that source;
- meshes, placements and layouts are constant opaque types (compared by value, written into a
  graph by ``__fx_repr__``): torch's DeviceMesh, which ours subclasses, is a symbolic one,
  whose fake stand-in would hide the C++ mesh;
- redistribute, to_local, full_tensor and shard_sizes, which shardtensor installs on
  torch.Tensor, are inlined from the traceable class instead of recorded as tensor methods;
- a traced ShardTensor's layout reads as a constant;
- compiled functions hand ShardTensors back (call_user_compiler);
- the composite operators that eager mode takes whole or decomposes its own way (upsampling,
  linear) reach a traced ShardTensor the same way (_traced_composites.py).

_compile.py teaches dynamo this when ``torch._dynamo`` is first imported, where the environment
asks for it.
"""

from __future__ import annotations

from . import _C, _placements, _tensor, _traceable, _traced_composites



def missing_support(dynamo) -> str | None:
    """What this torch lacks that tracing ShardTensors needs, or None. Asked before anything
    is patched, so that an older torch compiles as the default mode does instead of half-taught
    (torch 2.11 has no constant opaque types, for one)."""
    try:
        from torch._library.opaque_object import MemberType, register_custom_class  # noqa: F401
    except ImportError as e:
        return f"constant opaque types (torch._library.opaque_object.register_custom_class: {e})"
    for name in ("nonstrict_trace", "assume_constant_result", "mark_static"):
        if not hasattr(dynamo, name):
            return f"torch._dynamo.{name}"
    return None


def teach(dynamo) -> None:
    """Makes dynamo trace ShardTensors as their traceable form (_traceable.py)."""
    cls = dynamo.variables.builder.VariableBuilder
    original = cls.wrap_tensor
    if getattr(original, "_traces_shard_tensors", False):
        return
    from torch._dynamo.source import ChainedSource
    from torch._dynamo.bytecode_transformation import create_call_function
    from torch._guards import dataclass_with_cached_hash

    @dataclass_with_cached_hash(frozen=True)
    class TraceableSource(ChainedSource):
        """A ShardTensor argument as the traced graph takes it: ``as_traceable(base)``, built
        by the frame's bytecode before each call and by the guards (without autograd) when
        they check it."""

        @property
        def _name_template(self) -> str:
            return "___shardtensor_traceable({0})"

        def get_value(self, globals, locals, cache, **options):  # options: on_error, where torch has it
            if self in cache:
                return cache[self]
            value = _traceable.guard_view(self.base.get_value(globals, locals, cache, **options))
            cache[self] = value
            return value

        def reconstruct(self, codegen) -> None:
            codegen.add_push_null(lambda: codegen.load_import_from(_traceable.__name__, "as_traceable"))
            codegen(self.base)
            codegen.extend_output(create_call_function(1, False))

    # Named at module level, so that Inductor's cache can pickle the sources it keys on.
    TraceableSource.__qualname__ = TraceableSource.__name__
    globals()[TraceableSource.__name__] = TraceableSource

    def wrap_tensor(self, value):
        if _C.is_shard_tensor(value):
            traceable = _traceable.guard_view(value)
            # A graph is specialised on the layout, and so on every size: no dynamic shapes.
            dynamo.mark_static(traceable)
            return cls(self.tx, TraceableSource(self.get_source()))(traceable)
        return original(self, value)

    wrap_tensor._traces_shard_tensors = True
    cls.wrap_tensor = wrap_tensor

    # A mesh is a constant of the trace, compared by value (its ranks, shape and groups), which a
    # graph is specialised on; torch's own DeviceMesh is a symbolic opaque object instead, whose
    # fake stand-in would hide the C++ mesh that layouts are built on.
    from torch._library.opaque_object import MemberType, register_custom_class
    from ._mesh import DeviceMesh

    register_custom_class(DeviceMesh, typ="constant")
    register_custom_class(_C.Layout, typ="constant",
                          members={m: MemberType.USE_REAL for m in ("placements", "shape", "shard_sizes", "local_shape")})
    for placement in (_placements.Shard, _placements.Replicate, _placements.Partial, _placements.NormPartial):
        members = [m for m in _PLACEMENT_MEMBERS if m in dir(placement) or m in getattr(placement, "__slots__", ())]
        register_custom_class(placement, typ="constant", members={m: MemberType.USE_REAL for m in members})
    # to_local's backward makes a traced ShardTensor of a plain gradient, which AOTAutograd runs
    # as Python; the layout a from_local gives is computed once, when dynamo meets it.
    _traceable.to_local_in_graph = dynamo.nonstrict_trace(_traceable.to_local_in_graph)
    # The conversions a compiled frame's bytecode runs around its graph are not themselves traced.
    for name in ("as_traceable", "from_traceable", "guard_view"):
        setattr(_traceable, name, dynamo.disable(getattr(_traceable, name)))
    for name in ("layout_for_piece", "placements_of_layout", "shard_sizes_of", "mesh_of_layout"):
        setattr(_traceable, name, dynamo.assume_constant_result(getattr(_traceable, name)))
    dynamo.config.traceable_tensor_subclasses.add(_traceable.TraceableShardTensor)

    guards = dynamo.guards.GuardBuilder
    manager_of = guards.get_guard_manager_from_source

    def get_guard_manager_from_source(self, source):
        if type(source) is not TraceableSource:
            return manager_of(self, source)
        name = source.name
        if name not in self._cached_guard_managers:
            example_value = self.get(source)
            self._cached_guard_managers[name] = manager_of(self, source.base).lambda_manager(
                python_lambda=_traceable.guard_view, source=name, example_value=example_value,
                guard_manager_enum=self.get_guard_manager_type(source, example_value))
        return self._cached_guard_managers[name]

    guards.get_guard_manager_from_source = get_guard_manager_from_source
    # Where dynamo evaluates a guard's source by name (its failure reasons, say).
    dynamo.guards._get_closure_vars()["___shardtensor_traceable"] = _traceable.guard_view

    # shardtensor installs its methods on torch.Tensor, so dynamo would put a call of one in the
    # graph as a tensor method; on a traced ShardTensor it inlines the traceable class's own.
    from torch._dynamo.variables.functions import UserFunctionVariable

    tensor_variable = dynamo.variables.tensor.TensorVariable
    call_method = tensor_variable.call_method

    def call_method_inlining_ours(self, tx, name, args, kwargs):
        if name in _TRACEABLE_METHODS and self.python_type() is _traceable.TraceableShardTensor:
            method = UserFunctionVariable(getattr(_traceable.TraceableShardTensor, name))
            return tx.inline_user_function_return(method, [self, *args], kwargs)
        return call_method(self, tx, name, args, kwargs)

    tensor_variable.call_method = call_method_inlining_ours

    # A traced ShardTensor's layout is a constant of the trace (the guards compare it), also
    # where the tensor is a graph input; dynamo treats it so only where the tensor has no source.
    dynamic_getattr = tensor_variable.dynamic_getattr

    def dynamic_getattr_with_constant_layout(self, tx, name):
        if name == "_layout" and self.python_type() is _traceable.TraceableShardTensor:
            return dynamo.variables.VariableTracker.build(tx, self.proxy.node.meta["example_value"]._layout)
        return dynamic_getattr(self, tx, name)

    tensor_variable.dynamic_getattr = dynamic_getattr_with_constant_layout

    # A graph's ShardTensor results leave it in their traceable form; the caller gets
    # ShardTensors again, with the autograd link that carries their gradients in.
    output_graph = dynamo.output_graph.OutputGraph
    call_user_compiler = output_graph.call_user_compiler

    def call_user_compiler_returning_shard_tensors(self, gm, example_inputs):
        return _returning_shard_tensors(call_user_compiler(self, gm, example_inputs))

    output_graph.call_user_compiler = call_user_compiler_returning_shard_tensors
    _traced_composites.keep_whole()


_PLACEMENT_MEMBERS = ("dim", "reduce_op", "norm_type", "is_shard", "is_replicate", "is_partial", "__eq__", "__ne__",
                      "__hash__", "__repr__")
_TRACEABLE_METHODS = ("redistribute", "to_local", "full_tensor", "shard_sizes")


def _returning_shard_tensors(compiled):
    import torch._dynamo

    @torch._dynamo.disable
    def run(*args, **kwargs):
        out = compiled(*args, **kwargs)
        if isinstance(out, (list, tuple)) and any(isinstance(o, _traceable.TraceableShardTensor) for o in out):
            converted = [_traceable.from_traceable(o) if isinstance(o, _traceable.TraceableShardTensor) else o for o in out]
            return type(out)(converted) if isinstance(out, tuple) else converted
        return out

    run.__wrapped__ = compiled
    return run
