"""Dispatch policy and debug tools: strict mode, implicit replication, local_map and
visualize_sharding (CommDebugMode lives in _comm_debug)."""

from __future__ import annotations

import contextlib
import functools

import torch

from . import _C, _placements
from ._args import _encode_sizes
from ._comm_debug import CommDebugMode  # noqa: F401  (re-exported by the package)
from ._mesh import mesh_of_cpp
from ._tensor import _require

set_strict = _C.set_strict
is_strict = _C.is_strict
fallback_operators = _C.fallback_operators
propagated_operators = _C.propagated_operators


@contextlib.contextmanager
def strict(enabled: bool = True):
    """Within the block, an operator without a sharding rule raises instead of gathering."""
    previous = _C.is_strict()
    _C.set_strict(enabled)
    try:
        yield
    finally:
        _C.set_strict(previous)


@contextlib.contextmanager
def transport_options(transport=None, *, peer_memory=None, peer_copy_bytes=None, message_bytes=None, shared_arena=None):
    """Within the block (this thread), how bytes move where a call does not say: the
    redistributes operators make, their halo exchanges and mid-op reductions, and
    redistribute() calls without transport=/peer_memory=. transport: "auto", "collectives" or
    "messages"; peer_memory: whether same-host CPU ranks may copy through each other's memory;
    peer_copy_bytes: the smallest transfer per rank that may; message_bytes: the size
    point-to-point messages are cut to; shared_arena: whether peers read the parts that lie in
    their holder's shared arena in place (SHARDTENSOR_ARENA=1 installs the arenas). None keeps
    the outer block's choice (or the process's default, read once from SHARDTENSOR_TRANSPORT,
    SHARDTENSOR_PEER_MEMORY, SHARDTENSOR_PEER_COPY_BYTES, SHARDTENSOR_MESSAGE_BYTES and
    SHARDTENSOR_ARENA). Every rank must open the same
    block around the same calls; open it around backward() too."""
    scope = _C.TransportOptionsScope(transport, peer_memory, peer_copy_bytes, message_bytes, shared_arena)
    scope.enter()
    try:
        yield
    finally:
        scope.exit()


def set_implicit_replication(enabled: bool) -> None:
    """Whether plain tensors next to ShardTensors count as Replicate on their mesh (on by
    default, as in PhysicsNeMo; SHARDTENSOR_IMPLICIT_REPLICATION=0 starts it off). Off restores
    DTensor's refusal: such a tensor raises, except 0-d and single-element ones and inside
    ``implicit_replication()``. A plain tensor that requires grad keeps a plain gradient, the
    one-process value, reduced once per backward over the mesh dims the activations are split on."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_implicit_replication: expected True or False, got {enabled!r}")
    _C.set_implicit_replication(enabled)


is_implicit_replication = _C.is_implicit_replication


@contextlib.contextmanager
def implicit_replication():
    """Within the block (this thread), plain tensors next to ShardTensors count as Replicate,
    whatever set_implicit_replication() says."""
    scope = _C.ImplicitReplication()
    scope.enter()
    try:
        yield
    finally:
        scope.exit()


def visualize_sharding(x, header: str = "", use_rich: bool = False) -> str:
    """Prints (and returns) which rank owns which part of x; no communication."""
    _require(x, "visualize_sharding")
    text = (header + "\n" if header else "") + _C.visualize_sharding(x)
    print(text)
    return text


def layout_table(x) -> str:
    _require(x, "layout_table")
    return _C.layout_table(x)


def explain_redistribute(x, placements, sharding_shapes=None, *, transport=None, peer_memory=None) -> str:
    """The plan that x.redistribute(placements, transport=..., peer_memory=...) would run, with
    the transport of each step, without running it."""
    _require(x, "explain_redistribute")
    mesh = mesh_of_cpp(_C.mesh(x))
    encoded = _placements.encode(placements, mesh.ndim)
    return _C.explain_redistribute(x, encoded, _encode_sizes(sharding_shapes, _placements.decode(encoded), mesh),
                                   transport, peer_memory)


def local_map(func=None, out_placements=None, in_placements=None, device_mesh=None, *, redistribute_inputs=True):
    """DTensor's local_map: `func` runs on local tensors; its outputs get `out_placements`.

    Each ShardTensor argument is first redistributed to its entry of `in_placements` (None: as
    it is); plain tensors and non-tensor arguments pass through. Output shard sizes are
    inferred from the local outputs, so uneven outputs work. Differentiable.
    """
    if func is None:
        return functools.partial(local_map, out_placements=out_placements, in_placements=in_placements,
                                 device_mesh=device_mesh, redistribute_inputs=redistribute_inputs)
    if out_placements is None:
        raise ValueError("local_map: out_placements is required (one placement tuple per output)")
    single = not (out_placements and isinstance(out_placements[0], (list, tuple)))
    outs = [out_placements] if single else list(out_placements)

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        tensor_slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        inputs = [args[i] for i in tensor_slots]
        ins = []
        for i in tensor_slots:
            declared = None if in_placements is None else in_placements[i]
            ins.append(None if declared is None or not _C.is_shard_tensor(args[i]) else _placements.encode(declared))

        def on_locals(locals_):
            call_args = list(args)
            for slot, local in zip(tensor_slots, locals_):
                call_args[slot] = local
            result = func(*call_args, **kwargs)
            return [result] if single else list(result)

        results = _C.local_map(on_locals, inputs, ins, [_placements.encode(p) for p in outs])
        return results[0] if single else tuple(results)

    return wrapped
