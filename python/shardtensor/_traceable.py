"""A ShardTensor as torch.compile traces it: its local piece plus its layout, as a traceable
wrapper subclass.

dynamo and AOTAutograd trace tensor subclasses through Python's protocol
(``__tensor_flatten__``, ``__tensor_unflatten__``, ``__torch_dispatch__``); a ShardTensor is a C++
tensor, which they cannot look into. So a traced region sees each ShardTensor as a
``TraceableShardTensor``: its one inner tensor is the local piece (fake or functional while
tracing), and its flatten context is the layout, a hashable constant (the C++ spec: mesh,
placements, global shape, every shard size), which is what guards compare and what a graph is
specialised on.

Each ATen operator on one runs shardtensor's own C++ dispatch (sharding propagation, planning,
the kernels) on the traced pieces: the wrapper rebuilds C++ ShardTensors over them, calls the
operator's shardtensor kernel directly (below the tracing modes, which then see every local
operator the kernel runs), and wraps the results again. A ``TracingScope`` is open meanwhile,
so every move the kernel makes is recorded as torch's functional collectives
(src/comm/traced_collectives.h). The Python here runs only while tracing; a compiled graph holds
local ATen operators and collectives, and eager mode never meets this class.
"""

from __future__ import annotations

import itertools
import weakref

import torch
from torch.utils._pytree import tree_flatten, tree_map_only

from . import _C, _placements
from ._args import _encode_sizes, _mesh_or_current
from ._mesh import mesh_of_cpp

# The layouts compiled graphs name, by number: a layout is a constant of the trace. Layouts
# compare by value, so this holds one entry per distinct layout ever traced (a program's own
# handful), however often graphs are compiled.
_IN_GRAPHS: list = []
_LAYOUT_NUMBERS: dict = {}


def layout_number(layout) -> int:
    """The layout's number in _IN_GRAPHS, by which a graph names it (a constant of the trace)."""
    number = _LAYOUT_NUMBERS.get(layout)
    if number is None:
        number = _LAYOUT_NUMBERS[layout] = len(_IN_GRAPHS)
        _IN_GRAPHS.append(layout)
    return number


def _layout_fx_repr(layout):
    return f"_shardtensor_layout({layout_number(layout)})", {"_shardtensor_layout": _IN_GRAPHS.__getitem__}


_C.Layout.__fx_repr__ = _layout_fx_repr

_SHARDTENSOR_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


class TraceableShardTensor(torch.Tensor):
    """A ShardTensor's local piece and layout, for tracing (see the module's docstring)."""

    _local: torch.Tensor
    _layout: "_C.Layout"
    _strides: tuple

    @staticmethod
    def __new__(cls, local: torch.Tensor, layout, strides, requires_grad: bool = False):
        out = torch.Tensor._make_wrapper_subclass(
            cls, tuple(layout.shape), strides=tuple(strides), dtype=local.dtype, device=local.device,
            requires_grad=requires_grad)
        out._local = local
        out._layout = layout
        out._strides = tuple(strides)
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __tensor_flatten__(self):
        return ["_local"], (self._layout, self._strides)

    @staticmethod
    def __tensor_unflatten__(inner, context, outer_size, outer_stride):
        layout, strides = context
        return TraceableShardTensor(inner["_local"], layout, strides)

    # The ShardTensor methods, defined here so that dynamo inlines them (it would otherwise take
    # the ones shardtensor installs on torch.Tensor for operators to put in the graph).
    def redistribute(self, device_mesh=None, placements=None, *, async_op=False, sharding_shapes=None, transport=None,
                     peer_memory=None):
        # On the same mesh: a compiled region cannot compare meshes.
        if placements is None:
            return self
        encoded = _placements.encode(placements)
        return redistribute(self, encoded, _encode_sizes(sharding_shapes, _placements.decode(encoded), None))

    def to_local(self, *, grad_placements=None):
        return to_local_in_graph(self, _flat_grad_placements(grad_placements))

    def full_tensor(self, *, grad_placements=None):
        return full_tensor_in_graph(self, _flat_grad_placements(grad_placements))

    def shard_sizes(self):
        return shard_sizes_of(self._layout)

    @property
    def placements(self):
        return placements_of(self)

    @property
    def device_mesh(self):
        return mesh_of_layout(self._layout)

    def __repr__(self) -> str:
        return f"TraceableShardTensor({self._layout}, local={self._local!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.shardtensor.redistribute.default:
            return _redistribute_traced(*args, **(kwargs or {}))
        _refuse_plain_tensors_with_gradients(func, args, kwargs)
        wrapped = {}

        def to_cpp(t: TraceableShardTensor) -> torch.Tensor:
            cpp = _C.shard_tensor_over(t._local, t._layout, list(t._strides))
            wrapped[id(cpp)] = (t, cpp)
            return cpp

        cpp_args, cpp_kwargs = tree_map_only(TraceableShardTensor, to_cpp, (args, kwargs or {}))
        cpp_args = _numbers_wrapped(func, cpp_args)
        out = _run_or_break(func, cpp_args, cpp_kwargs)
        # An in-place operator may have given an argument a new piece: the traced one takes its
        # values, so that the mutation is one the tracer sees.
        if func._schema.is_mutable:
            for t, cpp in wrapped.values():
                piece = _C.local_piece_of(cpp)
                if piece is not t._local:
                    t._local.copy_(piece)
        return tree_map_only(torch.Tensor, lambda x: _from_cpp(x, wrapped), out)


def _refuse_plain_tensors_with_gradients(func, args, kwargs) -> None:
    """A plain tensor that requires grad (a plain weight) beside a ShardTensor: eager mode
    replicates it implicitly and hands its gradient back plain and whole (summed over the ranks),
    which a traced graph cannot do yet; dynamo breaks the graph here, and the operator runs
    eagerly, as it does without torch.compile."""
    plain = [a for a in tree_flatten((args, kwargs))[0]
             if isinstance(a, torch.Tensor) and not isinstance(a, TraceableShardTensor) and a.requires_grad]
    if plain and _dynamo_is_tracing():
        from torch._dynamo.exc import unimplemented

        unimplemented(
            gb_type="A plain tensor that requires grad meets a ShardTensor",
            context=f"{func}: a plain tensor of shape {tuple(plain[0].shape)} that requires grad",
            explanation="shardtensor replicates a plain tensor that meets a ShardTensor and hands its gradient back "
                        "plain and summed over the ranks; traced graphs do not do that yet, so this operator runs "
                        "eagerly (the same values and gradients as without torch.compile)",
            hints=["Make the weight a ShardTensor (distribute_tensor(w, mesh, [Replicate()])) to keep the graph whole."])


def _run_or_break(func, cpp_args, cpp_kwargs):
    """The operator's shardtensor kernel on the traced pieces. While dynamo traces, an operator
    that would fall back to gathering (no sharding rule, often because it reached shardtensor
    decomposed, as batch norm does under tracing; or a rule that refuses these inputs) breaks the
    graph instead: run eagerly, the whole operator has its kernel. The refusal is this thread's
    (_C.FallbackRefusal), and names the operator it refused."""
    if not _dynamo_is_tracing():
        return _traced(func.redispatch, _SHARDTENSOR_KERNEL, *cpp_args, **cpp_kwargs)
    refusal = _C.FallbackRefusal()
    try:
        with refusal:
            return _traced(func.redispatch, _SHARDTENSOR_KERNEL, *cpp_args, **cpp_kwargs)
    except NotImplementedError as e:
        if refusal.refused is None:
            raise
        from torch._dynamo.exc import unimplemented

        unimplemented(
            gb_type="An operator that would fall back on a ShardTensor",
            context=f"{func} (shardtensor: {refusal.refused})",
            explanation=f"{refusal.refused} would fall back to gathering its inputs here ({str(e).splitlines()[0]}); composite operators "
                        f"reach shardtensor decomposed while tracing. It runs eagerly, where the operator it came "
                        f"from has its kernel",
            hints=["Register a rule for it (shardtensor.register_sharding), or leave the graph break."])


def _dynamo_is_tracing() -> bool:
    """Whether dynamo is translating a frame now (running an operator on fake values to learn its
    result), where a graph break can still be taken; AOTAutograd only traces graphs dynamo took."""
    import sys

    convert = sys.modules.get("torch._dynamo.symbolic_convert")
    return convert is not None and getattr(convert.tls, "current_tx", None) is not None


_NUMBERS = (bool, int, float, complex)


def _numbers_wrapped(func, args):
    """``args`` with each Python number that stands for a Tensor argument (``x * 2``) as the
    wrapped number the C++ dispatcher would have made of it: redispatch takes tensors only."""
    schema = func._schema.arguments
    if not any(isinstance(a, _NUMBERS) for a in args):
        return args
    return tuple(_C.wrapped_number(a) if isinstance(a, _NUMBERS) and i < len(schema) and
                 isinstance(schema[i].type, torch.TensorType) else a for i, a in enumerate(args))


def _over(t: TraceableShardTensor) -> torch.Tensor:
    return _C.shard_tensor_over(t._local, t._layout, list(t._strides))


def _traced(fn, *args, **kwargs):
    scope = _C.TracingScope()
    scope.enter()
    try:
        return fn(*args, **kwargs)
    finally:
        scope.exit()


# ---- redistribute, as an operator that a graph can hold ----
# The target layout travels as integers: placements as (kind, value) pairs of the C++ encoding,
# flattened, and shard sizes as (tensor dim, count, sizes...) runs.

def _flat_grad_placements(grad_placements):
    """A user's grad_placements (placements, or None) as to_local_in_graph takes them."""
    return None if grad_placements is None else _flat_placements(_placements.encode(grad_placements))


def _flat_placements(encoded) -> list:
    return [v for pair in encoded for v in pair]


def _pairs(flat) -> list:
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


def _flat_sizes(encoded) -> list:
    flat = []
    for dim, sizes in encoded:
        flat += [dim, len(sizes), *sizes]
    return flat


def _runs(flat) -> list:
    runs, i = [], 0
    while i < len(flat):
        dim, n = flat[i], flat[i + 1]
        runs.append((dim, list(flat[i + 2:i + 2 + n])))
        i += 2 + n
    return runs


# The C++ operators that peer-memory moves are traced as (src/redistribute/transports/
# traced_exchange.cpp and traced_all_reduce.cpp) move bytes between ranks, so every
# rank must run their calls in the order traced: ordered effects keep graph passes, Inductor's
# scheduler among them, from reordering them against each other (two independent exchanges could
# otherwise run in different orders on different ranks, which the transport refuses).
for _moving in ("shardtensor::exchange_parts", "shardtensor::all_reduce_parts"):
    torch.library._register_effectful_op(_moving, torch._library.effects.EffectType.ORDERED)


@torch.library.custom_op("shardtensor::redistribute", mutates_args=())
def redistribute_op(x: torch.Tensor, placements: list[int], sizes: list[int]) -> torch.Tensor:
    """``x.redistribute`` inside a traced region (x a TraceableShardTensor; the dispatch above
    runs it). A plain tensor never carries a layout to move."""
    raise TypeError("shardtensor::redistribute takes a ShardTensor inside a compiled region; got a plain tensor")


@redistribute_op.register_fake
def _(x, placements, sizes):
    raise TypeError("shardtensor::redistribute takes a ShardTensor inside a compiled region; got a plain tensor")


def _redistribute_traced(x: TraceableShardTensor, placements, sizes) -> TraceableShardTensor:
    out = _traced(_C.redistribute, _over(x), x._layout.mesh, _pairs(placements), _runs(sizes) or None)
    return TraceableShardTensor(_C.local_piece_of(out), _C.layout_of(out), out.stride())


def _gradient_placements(layout) -> list:
    """The layout a redistribute's gradient goes back to: its input's, with every Partial
    replicated (a gradient is never pending a reduction), as eager mode's backward does."""
    return [(_REPLICATE, 0) if kind == _PARTIAL else (kind, value) for kind, value in layout.placements]


def _redistribute_setup(ctx, inputs, output):
    ctx.source = inputs[0]._layout


def _redistribute_backward(ctx, grad):
    layout = ctx.source
    return redistribute_op(grad, _flat_placements(_gradient_placements(layout)), _flat_sizes(layout.shard_sizes)), None, None


redistribute_op.register_autograd(_redistribute_backward, setup_context=_redistribute_setup)


def redistribute(x: TraceableShardTensor, placements, sizes=None) -> TraceableShardTensor:
    """``x`` in ``placements`` (C++-encoded pairs) with ``sizes`` (encoded, or None), traceably."""
    return redistribute_op(x, _flat_placements(placements), _flat_sizes(sizes or []))


# ---- to_local, from_local and full_tensor inside a traced region ----
# dynamo does not trace these (they are marked nonstrict_trace when dynamo loads: _compile.py);
# AOTAutograd runs them as Python on the traced pieces, so they may build layouts in C++.

class _ToLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, grad_placements):
        ctx.layout, ctx.strides, ctx.grad_placements = x._layout, x._strides, grad_placements
        return x._local.view_as(x._local)

    @staticmethod
    def backward(ctx, grad):
        # The gradient arrives as this rank's piece of a tensor laid out as the input was (or as
        # grad_placements says): the piece of a ShardTensor in that layout.
        layout = ctx.layout
        if ctx.grad_placements is not None and _pairs(ctx.grad_placements) != layout.placements:
            cpp = _C.from_local(grad, layout.mesh, _pairs(ctx.grad_placements), "trusted", list(layout.shape),
                                layout.shard_sizes, False)
            return TraceableShardTensor(_C.local_piece_of(cpp), _C.layout_of(cpp), cpp.stride()), None
        return TraceableShardTensor(grad.contiguous(), layout, ctx.strides), None


class _FromLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, layout, strides):
        ctx.layout = layout
        return TraceableShardTensor(local.view_as(local), layout, strides)

    @staticmethod
    def backward(ctx, grad):
        # The piece's gradient is the gradient's piece in the layout's gradient layout (a Partial
        # gradient's piece is only a term of it; a gradient laid out otherwise has other
        # pieces), as eager from_local's backward moves it. Always a redistribute, never a
        # branch on the gradient's layout: dynamo traces this backward once, for a gradient
        # laid out as the output is, and would keep only the moves that layout needs; the
        # redistribute operator decides when AOTAutograd runs it on the gradient that comes
        # (Partial where the output is Replicate: a tensor-parallel block's input).
        return redistribute(grad, _gradient_placements(ctx.layout), ctx.layout.shard_sizes)._local, None, None


def _moved(grad: TraceableShardTensor, placements: list, shard_sizes) -> TraceableShardTensor:
    """``grad`` in ``placements`` with ``shard_sizes``: a redistribute where it is not so already."""
    if grad._layout.placements != placements or grad._layout.shard_sizes != shard_sizes:
        grad = redistribute(grad, placements, shard_sizes)
    return grad


def to_local_in_graph(x: TraceableShardTensor, grad_placements=None) -> torch.Tensor:
    """``x.to_local(grad_placements=...)`` in a traced region (placements C++-encoded, flat)."""
    return _ToLocal.apply(x, grad_placements)


def from_local_in_graph(local: torch.Tensor, device_mesh, placements, sharding_shapes, shape, trusted: bool):
    """``from_local`` in a traced region: the layout is built in C++ from the piece's shape once,
    when tracing (torch.chunk sizes, given ones, or the ranks' sizes gathered), and the piece
    wrapped in it. ``placements`` are C++-encoded pairs (None: Replicate on every mesh dim).

    With ``sharding_shapes="infer"`` the graph is specialised on the sizes the ranks' pieces had
    when it was traced, and each run gathers them again (as eager mode's from_local does) and
    checks them: a rank's graph is guarded on its own piece only."""
    layout, strides, number = layout_for_piece(device_mesh, placements, sharding_shapes, shape, trusted,
                                               list(local.shape), local.dtype)
    if sharding_shapes == "infer":
        torch.ops.shardtensor.check_inferred_layout(local, number)
    return _FromLocal.apply(local, layout, strides)


@torch.library.custom_op("shardtensor::check_inferred_layout", mutates_args=())
def check_inferred_layout(local: torch.Tensor, layout: int) -> None:
    """Raises on every rank where the pieces' sizes, gathered now, give another layout than the
    one a graph was traced for (layout: its number in _IN_GRAPHS)."""
    traced = _IN_GRAPHS[layout]
    mesh = mesh_of_layout(traced)
    now = _C.layout_of(_C.from_local(local, mesh._cpp, [tuple(p) for p in traced.placements], "infer", None, None, False))
    if now != traced:
        raise ValueError(f"from_local(sharding_shapes='infer') in a compiled graph: the ranks' pieces now make {now}, "
                         f"where the graph was traced for {traced}; every rank's piece must keep the size it had when "
                         f"the graph was traced (torch._dynamo.reset() and call again to trace anew)")


@check_inferred_layout.register_fake
def _(local, layout):
    return None


# Kept, and run in program order with the moves, although nothing reads a result.
torch.library._register_effectful_op("shardtensor::check_inferred_layout", torch._library.effects.EffectType.ORDERED)


def layout_for_piece(device_mesh, placements, sharding_shapes, shape, trusted, local_shape, dtype):
    """The layout from_local gives a piece of ``local_shape``, its global strides and its number
    (layout_number): constants of the trace (dynamo calls it once, at trace time: _compile.py)."""
    mesh = _mesh_or_current(device_mesh, "from_local")
    placements = [(_REPLICATE, 0)] * mesh.ndim if placements is None else [tuple(p) for p in placements]
    if isinstance(sharding_shapes, str):
        if sharding_shapes not in ("chunk", "infer"):
            raise ValueError(f"from_local: sharding_shapes={sharding_shapes!r}; allowed are 'chunk', 'infer' or a dict")
        # "infer" gathers the ranks' shapes now, on every rank (they trace together).
        mode, sizes = sharding_shapes, None
    else:
        mode, sizes = "trusted" if trusted else "given", _encode_sizes(sharding_shapes, _placements.decode(placements), mesh)
    piece = torch.empty(local_shape, dtype=dtype, device=mesh.device_type)  # once, at trace time
    cpp = _C.from_local(piece, mesh._cpp, placements, mode, shape, sizes, False)
    layout = _C.layout_of(cpp)
    return layout, cpp.stride(), layout_number(layout)


def full_tensor_in_graph(x: TraceableShardTensor, grad_placements=None) -> torch.Tensor:
    whole = redistribute(x, [(_REPLICATE, 0)] * len(placements_of_layout(x._layout)))
    return to_local_in_graph(whole, grad_placements)


def placements_of(x: TraceableShardTensor):
    return placements_of_layout(x._layout)


# What traced code reads of a layout: constants of the trace (dynamo evaluates them once).
def placements_of_layout(layout) -> tuple:
    return tuple(_placements.decode(layout.placements))


def mesh_of_layout(layout):
    return mesh_of_cpp(layout.mesh)


def shard_sizes_of(layout) -> dict:
    return {dim: list(sizes) for dim, sizes in layout.shard_sizes}


def _from_cpp(x: torch.Tensor, wrapped=None):
    if not _C.is_shard_tensor(x):
        return x
    if wrapped and id(x) in wrapped and wrapped[id(x)][1] is x:
        return wrapped[id(x)][0]  # an in-place operator returns its argument
    return TraceableShardTensor(_C.local_piece_of(x), _C.layout_of(x), x.stride())


_PARTIAL, _REPLICATE = 2, 1  # the placement kinds of the C++ encoding (_placements.py)


# ---- a compiled graph's edges ----
# A graph takes each ShardTensor as its plain piece (C++ piece_into_graph, which the frame's
# bytecode calls) and rebuilds the traced ShardTensor inside, the layout a constant (into_graph);
# its ShardTensor results leave it as pieces (out_of_graph) that the caller gets back as
# ShardTensors (C++ shard_tensor_out_of_graph). AOTAutograd then sees plain tensors at the
# graph's edges, so its runtime wrappers do no work per call for the subclass.

def into_graph(piece: torch.Tensor, layout, strides, slot: int) -> TraceableShardTensor:
    """A graph's input piece as the traced ShardTensor of ``layout``. Its backward chooses the
    layout of the piece's gradient (that of a leaf's gradient in eager mode: the input's, but
    Partial where the input is Replicate and the gradient comes Partial, its reduction left to
    whoever reads it) and writes it in gradient slot ``slot``, which the piece's C++ conversion
    reads when the gradient leaves the graph."""
    return _IntoGraph.apply(piece, layout, strides, slot)


# The gradient layouts of graphs' input pieces, by number (into_graph). Held weakly: a slot lives
# as long as the compiled code whose frame holds it (dynamo's installed globals, dropped with the
# graph), so recompiling does not grow this.
_GRADIENT_SLOTS: "weakref.WeakValueDictionary[int, _C.GradientLayoutSlot]" = weakref.WeakValueDictionary()
_SLOT_NUMBERS = itertools.count()


def new_gradient_slot():
    """A new gradient slot and its number; the caller keeps the slot alive (dynamo: a global of
    the frame it compiles)."""
    slot = _C.GradientLayoutSlot()
    number = next(_SLOT_NUMBERS)
    _GRADIENT_SLOTS[number] = slot
    return number, slot


class _IntoGraph(torch.autograd.Function):
    @staticmethod
    def forward(ctx, piece, layout, strides, slot):
        ctx.slot = slot
        return _FromLocal.forward(ctx, piece, layout, strides)

    @staticmethod
    def backward(ctx, grad):
        layout = ctx.layout
        target = [came if (kind, came[0]) == (_REPLICATE, _PARTIAL) else wanted
                  for (kind, _), came, wanted in zip(layout.placements, grad._layout.placements, _gradient_placements(layout))]
        grad = _moved(grad, target, layout.shard_sizes)
        _GRADIENT_SLOTS[ctx.slot].layout = grad._layout
        return grad._local, None, None, None


def out_of_graph(x: TraceableShardTensor) -> torch.Tensor:
    """A graph's traced ShardTensor result as its piece; its gradient comes back in the gradient
    layout, as shard_tensor_out_of_graph's backward hands it in."""
    return _ToLocal.apply(x, _flat_placements(_gradient_placements(x._layout)))


def guard_piece(x: torch.Tensor, layout, strides: tuple):
    """What dynamo's guards compare a ShardTensor argument by, for a graph traced for ``layout``
    and global ``strides``: an alias of its piece that requires grad where ``x`` does (the same
    object while the piece stays: the guards compare tensors by identity), or None where ``x``
    is not a ShardTensor of that layout (the guard fails: another graph). The guards call the
    C++ form directly (_C.PieceGuard)."""
    return _C.guard_piece(x, layout, list(strides))


def guard_piece_of_any_layout(x: torch.Tensor):
    """guard_piece for whatever layout ``x`` has now (what the guards' failure reasons compare)."""
    if not _C.is_shard_tensor(x):
        return None
    return guard_piece(x, _C.layout_of(x), x.stride())
