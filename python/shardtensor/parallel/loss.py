"""DTensor's loss_parallel: cross-entropy on logits split along the class dim, without gathering them.

Outside the block, F.cross_entropy on such logits gathers them (its log_softmax normalises over
the split dim). Inside it, the loss is computed from each rank's classes with log-sum-exp:

    m      = max over classes            a Partial(max), reduced: one all-reduce of N values
    z      = sum of exp(x - m)           a Partial(sum) of each rank's classes
    x_t    = the target's logit - m      a gather on the split table: the owner's value, 0 elsewhere
    loss_i = log z - x_t                 z and x_t (and, with label smoothing, the sum of the
                                         logits) travel in one all-reduce of 2N (3N) values

Everything is ShardTensor operators, so the backward follows from their rules and sends nothing:
the gradient softmax - onehot is computed on each rank's classes.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
import torch.nn.functional as F

from .. import _C, _handlers
from .._placements import Partial, Replicate, Shard
from .._tensor import distribute_tensor, from_local

__all__ = ["loss_parallel"]


@contextlib.contextmanager
def loss_parallel():
    """Within the block, ``F.cross_entropy`` (and ``nn.CrossEntropyLoss``) on ShardTensor logits
    split along the class dim (dim 1, or 0 for one unbatched sample) moves only reductions of
    one value per sample, never the logits.

    The logits are laid out by Shard or Replicate on every mesh dim: typically Shard(-1) of a
    ColwiseParallel output with ``use_local_output=False`` (pass ``logits.transpose(1, 2)`` or
    ``logits.flatten(0, 1)`` to put the classes at dim 1); a Partial raises ValueError. The
    target holds class indices: a plain tensor every rank holds whole, or a ShardTensor laid out
    as the logits without their class dim (where the logits split another dim the target must be
    a ShardTensor). ``weight``, ``ignore_index``, ``reduction`` and ``label_smoothing`` mean what
    they mean in torch; class probabilities as targets are not supported (as in DTensor). The
    loss is a ShardTensor; unlike DTensor's, its backward may run outside the block.
    """
    registry = _handlers.REGISTRIES["_function_registry"]
    cross_entropy = getattr(F.cross_entropy, "_shardtensor_original", F.cross_entropy)
    had, previous = cross_entropy in registry, registry.get(cross_entropy)
    registry[cross_entropy] = _cross_entropy
    try:
        yield
    finally:
        if had:
            registry[cross_entropy] = previous
        else:
            del registry[cross_entropy]


def _without_partial(t):
    return [Replicate() if p.is_partial() else p for p in t.placements]


def _target_layout(logits, class_dim: int):
    """The target's placements and sizes: the logits' without their class dim."""
    placements, sizes = [], {}
    logit_sizes = logits.shard_sizes()
    for p in logits.placements:
        if p.is_shard(class_dim) or not p.is_shard():
            placements.append(Replicate())
        else:
            dim = p.dim - 1 if p.dim > class_dim else p.dim
            placements.append(Shard(dim))
            sizes[dim] = logit_sizes[p.dim]
    return placements, sizes


def _laid_out(t, mesh, placements, sizes, what: str):
    """`t` (plain and whole on every rank, or a ShardTensor) as a ShardTensor laid out so."""
    if _C.is_shard_tensor(t):
        if t.device_mesh != mesh:
            raise ValueError(f"loss_parallel: cross_entropy's {what} is on {t.device_mesh}, the logits on {mesh}; "
                             f"redistribute it onto the logits' mesh")
        if t.placements == tuple(placements) and all(t.shard_sizes().get(d) == s for d, s in sizes.items()):
            return t
        return t.redistribute(mesh, placements, sharding_shapes=sizes or None)
    if any(p.is_shard() for p in placements):
        raise ValueError(f"loss_parallel: the logits are split along a dim the {what} has too, so the {what} must be a "
                         f"ShardTensor laid out {placements} with sizes {sizes}; a plain tensor is ambiguous (whole or "
                         f"this rank's piece?). Make it with from_local or distribute_tensor")
    if t.requires_grad:
        return from_local(t, mesh, placements)
    return distribute_tensor(t, mesh, placements, src_data_rank=None)  # each rank's own whole copy, no message


def _class_max(x, class_dim: int):
    """The max over the class dim, replicated along it: one all-reduce of one value per sample.
    It is a constant shift whose gradient cancels, so it is taken outside autograd."""
    x = x.detach()
    class_sizes = x.shard_sizes().get(class_dim, [])
    if 0 not in class_sizes:
        shift = x.amax(class_dim, keepdim=True)  # a Partial(max) of each rank's classes
        return shift.redistribute(x.device_mesh, _without_partial(shift))
    # A rank without classes has no max of its own, and aten::amax over the split dim then
    # gathers the logits; its part of the pending max is -inf instead.
    local = x._local_tensor
    if local.shape[class_dim] > 0:
        local = local.amax(class_dim, keepdim=True)
    else:
        local = local.new_full(local.shape[:class_dim] + (1,) + local.shape[class_dim + 1:], float("-inf"))
    placements = [Partial("max") if p.is_shard(class_dim) else p for p in x.placements]
    # The global shape follows from x's sizes and the one-wide class dim: no shape to pass (and
    # to check over the mesh on every call).
    sizes = {d: s for d, s in x.shard_sizes().items() if d != class_dim}
    shift = from_local(local, x.device_mesh, placements, sharding_shapes=sizes)
    return shift.redistribute(x.device_mesh, _without_partial(shift))


def _cross_entropy(func, types, args, kwargs):
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    x, target, weight = a["input"], a["target"], a["weight"]
    ignore_index, label_smoothing, reduction = a["ignore_index"], float(a["label_smoothing"]), a["reduction"]
    if a["size_average"] is not None or a["reduce"] is not None:
        reduction = torch.nn._reduction.legacy_get_string(a["size_average"], a["reduce"])
    if not (isinstance(x, torch.Tensor) and _C.is_shard_tensor(x)):
        raise ValueError("loss_parallel: cross_entropy's input (the logits) must be a ShardTensor split along the "
                         f"class dim, got a plain {type(x).__name__}; make it with from_local or take a "
                         "ColwiseParallel output with use_local_output=False")
    class_dim = 1 if x.ndim >= 2 else 0
    if any(p.is_partial() for p in x.placements):
        raise ValueError(f"loss_parallel: cross_entropy takes logits laid out by Shard or Replicate, typically "
                         f"Shard({class_dim}) on the class dim; got {list(x.placements)}. Redistribute them first, "
                         f"e.g. logits.redistribute(placements=[Shard({class_dim})])")
    if not isinstance(target, torch.Tensor) or target.is_floating_point():
        raise NotImplementedError("loss_parallel: cross_entropy takes class indices as the target; class "
                                  "probabilities are not supported (as in DTensor)")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"loss_parallel: reduction={reduction!r}; allowed are 'none', 'mean' and 'sum'")
    mesh, n_classes = x.device_mesh, x.shape[class_dim]
    target = _laid_out(target, mesh, *_target_layout(x, class_dim), "target")
    if weight is not None:
        weight = _laid_out(weight, mesh, [Replicate()] * mesh.ndim, {}, "weight")

    shift = _class_max(x, class_dim)
    shifted = x - shift
    valid = target != ignore_index
    safe_target = torch.where(valid, target, 0)
    parts = [shifted.exp().sum(class_dim, keepdim=True), shifted.gather(class_dim, safe_target.unsqueeze(class_dim))]
    if label_smoothing > 0:
        if weight is None:
            parts.append(shifted.sum(class_dim, keepdim=True))
        else:
            view = [1] * x.ndim
            view[class_dim] = n_classes
            parts.append((shifted * weight.view(view)).sum(class_dim, keepdim=True))
    sums = torch.cat(parts, class_dim)  # pending sums on the class-split mesh dim: one all-reduce
    sums = sums.redistribute(mesh, _without_partial(sums))
    log_z = sums.narrow(class_dim, 0, 1).squeeze(class_dim).log()
    nll = log_z - sums.narrow(class_dim, 1, 1).squeeze(class_dim)
    if weight is None:
        nll = torch.where(valid, nll, 0.0)
        total = valid.sum()
    else:
        target_weight = torch.where(valid, weight[safe_target], 0.0)
        nll = nll * target_weight
        total = target_weight.sum()

    def reduce(per_sample):
        if reduction == "none":
            return per_sample
        return per_sample.sum() if reduction == "sum" else per_sample.sum() / total

    loss = reduce(nll)
    if label_smoothing > 0:
        # -sum_c w_c log p_c = log z * sum_c w_c - sum_c w_c (x_c - m)
        weight_sum = n_classes if weight is None else weight.sum()
        smooth = log_z * weight_sum - sums.narrow(class_dim, 2, 1).squeeze(class_dim)
        smooth = torch.where(valid, smooth, 0.0)
        loss = (1 - label_smoothing) * loss + reduce(smooth) * (label_smoothing / n_classes)
    return loss
