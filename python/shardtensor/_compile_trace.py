"""torch.compile on ShardTensors, traced (the default; SHARDTENSOR_COMPILE=eager opts out): every
move an operator of the graph.

dynamo traces a tensor subclass only through Python's traceable-wrapper protocol; a ShardTensor
is a C++ tensor. So dynamo is taught, when it loads, to take each ShardTensor it meets (an
argument, a parameter of a module) as a graph input of its local piece, wrapped inside the graph
in its traceable form (_traceable.TraceableShardTensor: the piece plus the layout as a constant).
The guards compare the layout (mesh, placements, every shard size), so a call with another split
recompiles. A graph's ShardTensor results leave it as pieces and come back to the caller as
ShardTensors, with their autograd links. The subclass thus lives only inside the graph: at its
edges AOTAutograd sees plain tensors, and its runtime wrappers do no work per call for the
subclass (which, at the edges, cost the compiled TP-MLP step more than Inductor saved:
bench/RESULTS.md). Inside the graph, every ATen operator runs shardtensor's C++ dispatch on the
traced pieces, and the moves it makes are recorded as operators (src/comm/traced_collectives.h):
torch's functional collectives, which Inductor can schedule and overlap with the local work, or
shardtensor's own peer-memory moves.

What dynamo is taught, and why each is needed:
- wrap_tensor: a ShardTensor is wrapped as its piece (PieceSource: the frame's bytecode hands the
  graph ``_C.piece_into_graph(x)``; the guards compare an alias of the piece, or None where the
  layout changed) and rebuilt in the graph by a call of _traceable.into_graph;
- the guard builder learns that source;
- meshes, placements and layouts are constant opaque types (compared by value, written into a
  graph by ``__fx_repr__``): torch's DeviceMesh, which ours subclasses, is a symbolic one,
  whose fake stand-in would hide the C++ mesh;
- redistribute, to_local, full_tensor and shard_sizes, which shardtensor installs on
  torch.Tensor, are inlined from the traceable class instead of recorded as tensor methods;
- a traced ShardTensor's layout reads as a constant;
- compiled functions hand ShardTensors back (call_user_compiler: the graph's ShardTensor results
  leave it as pieces, rebuilt around the compiled function);
- the composite operators that eager mode takes whole or decomposes its own way (upsampling,
  linear) reach a traced ShardTensor the same way (_traced_composites.py).

_compile.py teaches dynamo this when ``torch._dynamo`` is first imported, unless the environment
opts out. Every private part of torch used here is listed in _torch_private.py, with its reason.
"""

from __future__ import annotations

from . import _C, _placements, _traceable, _traced_composites
from ._mesh import DeviceMesh


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
    from torch._dynamo.variables.builder import wrap_fx_proxy
    from torch._guards import dataclass_with_cached_hash

    @dataclass_with_cached_hash(frozen=True)
    class PieceSource(ChainedSource):
        """A ShardTensor argument as a compiled graph takes it: its piece, which the frame's
        bytecode gets before each call (``_C.piece_into_graph(base)``, differentiable) and the
        guards compare (_traceable.guard_piece: an alias, None where the layout changed)."""

        slot: int = -1  # the gradient slot of this input (_traceable.into_graph)

        @property
        def _name_template(self) -> str:
            return "___shardtensor_piece({0})"

        def get_value(self, globals, locals, cache, **options):  # options: on_error, where torch has it
            if self in cache:
                return cache[self]
            value = _traceable.guard_piece_of_any_layout(self.base.get_value(globals, locals, cache, **options))
            cache[self] = value
            return value

        def reconstruct(self, codegen) -> None:
            codegen.add_push_null(lambda: codegen.load_import_from(_C.__name__, "piece_into_graph"))
            codegen(self.base)
            slot = codegen.tx.output.install_global_by_id("___shardtensor_gradient_slot",
                                                          _traceable._GRADIENT_SLOTS[self.slot])
            codegen.append_output(codegen.create_load_global(slot, add=True))
            codegen.extend_output(create_call_function(2, False))

    # Named at module level, so that Inductor's cache can pickle the sources it keys on.
    PieceSource.__qualname__ = PieceSource.__name__
    globals()[PieceSource.__name__] = PieceSource

    def wrap_tensor(self, value):
        if not _C.is_shard_tensor(value):
            return original(self, value)
        # The graph's input is the piece; the ShardTensor is rebuilt inside from the layout, a
        # constant of the trace (so a graph is specialised on every size: no dynamic shapes).
        layout, strides = _C.layout_of(value), tuple(value.stride())
        piece = _traceable.guard_piece(value, layout, strides)
        dynamo.mark_static(piece)
        slot, slot_object = _traceable.new_gradient_slot()
        # Held by the frame's globals from now on, as long as the graph lives (the bytecode
        # passes it to piece_into_graph: PieceSource.reconstruct).
        self.tx.output.install_global_by_id("___shardtensor_gradient_slot", slot_object)
        piece_variable = cls(self.tx, PieceSource(self.get_source(), slot))(piece)
        # A call node of its own, not a traced call: dynamo would trace nonstrict_trace's
        # flattening of the arguments, and guard each call on pytree's globals.
        proxy = self.tx.output.create_proxy("call_function", _traceable.into_graph,
                                            (piece_variable.as_proxy(), layout, strides, slot), {})
        return wrap_fx_proxy(self.tx, proxy)

    wrap_tensor._traces_shard_tensors = True
    cls.wrap_tensor = wrap_tensor

    # A mesh is a constant of the trace, compared by value (its ranks, shape and groups), which a
    # graph is specialised on; torch's own DeviceMesh is a symbolic opaque object instead, whose
    # fake stand-in would hide the C++ mesh that layouts are built on.
    from torch._library.opaque_object import MemberType, register_custom_class

    register_custom_class(DeviceMesh, typ="constant")
    register_custom_class(_C.Layout, typ="constant",
                          members={m: MemberType.USE_REAL for m in ("placements", "shape", "shard_sizes", "local_shape")})
    for placement in (_placements.Shard, _placements.Replicate, _placements.Partial, _placements.NormPartial):
        members = [m for m in _PLACEMENT_MEMBERS if m in dir(placement) or m in getattr(placement, "__slots__", ())]
        register_custom_class(placement, typ="constant", members={m: MemberType.USE_REAL for m in members})
    # to_local's backward makes a traced ShardTensor of a plain gradient, which AOTAutograd runs
    # as Python; the layout a from_local gives is computed once, when dynamo meets it.
    _traceable.to_local_in_graph = dynamo.nonstrict_trace(_traceable.to_local_in_graph)
    for name in ("layout_for_piece", "placements_of_layout", "shard_sizes_of", "mesh_of_layout"):
        setattr(_traceable, name, dynamo.assume_constant_result(getattr(_traceable, name)))
    dynamo.config.traceable_tensor_subclasses.add(_traceable.TraceableShardTensor)

    guards = dynamo.guards.GuardBuilder
    manager_of = guards.get_guard_manager_from_source

    def get_guard_manager_from_source(self, source):
        if type(source) is not PieceSource:
            return manager_of(self, source)
        name = source.name
        if name not in self._cached_guard_managers:
            example_value = self.get(source)
            traced = self.get(source.base)
            layout, strides = _C.layout_of(traced), tuple(traced.stride())
            self._cached_guard_managers[name] = manager_of(self, source.base).lambda_manager(
                python_lambda=_C.PieceGuard(layout, list(strides)), source=name,
                example_value=example_value, guard_manager_enum=self.get_guard_manager_type(source, example_value))
        return self._cached_guard_managers[name]

    guards.get_guard_manager_from_source = get_guard_manager_from_source
    # Where dynamo evaluates a guard's source by name (its failure reasons, say).
    dynamo.guards._get_closure_vars()["___shardtensor_piece"] = _traceable.guard_piece_of_any_layout

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

    # A traced ShardTensor's layout is a constant of the trace (the guards compare it). Where the
    # tensor stands for a graph's input, dynamo would read it off the real value it associates
    # with that input (the ShardTensor, whose layout is no attribute).
    dynamic_getattr = tensor_variable.dynamic_getattr

    def dynamic_getattr_with_constant_layout(self, tx, name):
        if name == "_layout" and self.python_type() is _traceable.TraceableShardTensor:
            return dynamo.variables.VariableTracker.build(tx, self.proxy.node.meta["example_value"]._layout)
        return dynamic_getattr(self, tx, name)

    tensor_variable.dynamic_getattr = dynamic_getattr_with_constant_layout

    # A graph's ShardTensor results leave it as their pieces; the caller gets ShardTensors
    # again, with the autograd link that carries their gradients in.
    output_graph = dynamo.output_graph.OutputGraph
    call_user_compiler = output_graph.call_user_compiler

    def call_user_compiler_returning_shard_tensors(self, gm, example_inputs):
        leaving = _pieces_out(gm)
        compiled = call_user_compiler(self, gm, example_inputs)
        return _returning_shard_tensors(compiled, leaving) if leaving else compiled

    output_graph.call_user_compiler = call_user_compiler_returning_shard_tensors
    _traced_composites.keep_whole()


_PLACEMENT_MEMBERS = ("dim", "reduce_op", "norm_type", "is_shard", "is_replicate", "is_partial", "__eq__", "__ne__",
                      "__hash__", "__repr__")
_TRACEABLE_METHODS = ("redistribute", "to_local", "full_tensor", "shard_sizes")


def _pieces_out(gm) -> list:
    """Makes each traced ShardTensor that graph ``gm`` returns leave it as its piece
    (_traceable.out_of_graph); returns (position, layout, global strides) of each."""
    import torch

    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    results, leaving, pieces = output.args[0], [], []
    with gm.graph.inserting_before(output):
        for i, node in enumerate(results):
            value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
            if isinstance(value, _traceable.TraceableShardTensor):
                leaving.append((i, value._layout, list(value._strides)))
                node = gm.graph.call_function(_traceable.out_of_graph, (node,))
                node.meta["example_value"] = value._local
            pieces.append(node)
    if leaving:
        output.args = (type(results)(pieces),)
        gm.recompile()
    return leaving


def _returning_shard_tensors(compiled, leaving: list):
    """``compiled``, with the pieces at the positions ``leaving`` names rebuilt as ShardTensors of
    their layouts (differentiably: their gradients go back into the graph as pieces). A C++
    callable: the frame's bytecode calls it around the graph on every call."""
    # The backend hands back its graph behind dynamo's disable(), as dynamo then wraps the result
    # too; unwrapped, a call pays for one disable, not two.
    inner = compiled
    if getattr(compiled, "_torchdynamo_disable", False):
        inner = compiled._torchdynamo_orig_callable
    run = _C.ShardTensorResults(inner, leaving)
    run.__wrapped__ = compiled
    return run
