"""torch.distributed.checkpoint (DCP) and torch's state-dict utilities on ShardTensors.

DCP asks a distributed tensor for its pieces through the protocol DTensor implements:
``__create_write_items__`` (what this rank writes), ``__create_chunk_list__`` (which part of the
global tensor this rank holds, for loading) and ``__get_tensor_shard__`` (the local tensor to read
from or load into). A ShardTensor answers with its local piece and the piece's global offsets,
any layout and sizes, nested sharding included; DCP's default planners then save each element
once (replicated pieces are deduplicated), and load by the overlap of saved chunks with the
pieces of the tensor loaded into: any other world size, mesh, placements or split, and
checkpoints written by DTensor programs (whose chunks are described the same way).

The protocol is installed on torch.Tensor as properties that raise AttributeError for every
tensor but a ShardTensor, so DCP's ``hasattr`` checks still take their own paths for plain
tensors, ShardedTensors and DTensors (which define their own).

torch's ``get_model_state_dict`` / ``get_optimizer_state_dict`` with ``full_state_dict=True``
gather DTensors through ``_gather_state_dict``; the wrapper installed here first makes every
ShardTensor in the state dict its full tensor (on every rank, in the state dict's order), so the
result holds plain whole tensors, as it does for DTensor models. ``dcp.async_save`` stages
each ShardTensor as a ShardTensor over a CPU copy of its piece.
"""

from __future__ import annotations

import torch

from . import _C
from ._tensor import from_local
from ._after_import import after_import


def _refuse_partial(t, what: str) -> None:
    if any(p.is_partial() for p in t.placements):
        raise ValueError(f"{what}: a ShardTensor with a Partial placement ({list(t.placements)}) holds terms of a "
                         f"sum, not values; redistribute it to Replicate or Shard before checkpointing")


def _chunk(t):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    return ChunkStorageMetadata(offsets=torch.Size(_C.local_offsets(t)), sizes=torch.Size(_C.local_shape(t)))


def _holds_elements(t) -> bool:
    # An empty piece (a rank outside the mesh, a shard of size 0) writes and reads nothing; a
    # tensor with no elements at all still has its one (empty) chunk, so DCP records its shape.
    return t._local_tensor.numel() > 0 or (t.numel() == 0 and t.device_mesh.get_coordinate() is not None)


def _create_write_items(self, fqn, obj):
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    _refuse_partial(self, f"torch.distributed.checkpoint: saving {fqn!r}")
    if not _holds_elements(self):
        return []
    chunk = _chunk(self)
    return [WriteItem(index=MetadataIndex(fqn, chunk.offsets), type=WriteItemType.SHARD,
                      tensor_data=TensorWriteData(chunk=chunk,
                                                  properties=TensorProperties.create_from_tensor(self._local_tensor),
                                                  size=self.shape))]


def _create_chunk_list(self):
    _refuse_partial(self, "torch.distributed.checkpoint: loading")
    return [_chunk(self)] if _holds_elements(self) else []


def _get_tensor_shard(self, index):
    _refuse_partial(self, f"torch.distributed.checkpoint: {index.fqn!r}")
    return self._local_tensor


def _protocol_property(method):
    def get(self):
        if not _C.is_shard_tensor(self):
            raise AttributeError(method.__name__)  # hasattr is False: DCP's own path for this tensor
        return method.__get__(self)
    return property(get)


_PROTOCOL = {
    "__create_write_items__": _create_write_items,
    "__create_chunk_list__": _create_chunk_list,
    "__get_tensor_shard__": _get_tensor_shard,
}


def _full_tensor(t):
    _refuse_partial(t, "full_state_dict")
    return t.full_tensor()


def _map_shard_tensors(tree, fn):
    """The (nested) state dict with every ShardTensor t replaced by fn(t)."""
    if isinstance(tree, torch.Tensor) and _C.is_shard_tensor(tree):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: _map_shard_tensors(v, fn) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map_shard_tensors(v, fn) for v in tree)
    return tree


def _wrap_create_cpu_state_dict(utils) -> None:
    """dcp.async_save stages the state dict in CPU memory (_create_cpu_state_dict, then
    _copy_state_dict into it): a ShardTensor's stage is a ShardTensor of the same layout over a
    CPU copy of its local piece, made by torch's code for that piece."""
    create = getattr(utils, "_create_cpu_state_dict", None)
    if create is None or getattr(create, "_shardtensor", False):
        return

    def _create_cpu_state_dict(state_dict, *args, **kwargs):
        originals = []

        def strip(t):
            originals.append(t)
            return ("shardtensor", len(originals) - 1, t._local_tensor)

        def rewrap(tree):
            if isinstance(tree, tuple) and len(tree) == 3 and tree[0] == "shardtensor":
                t = originals[tree[1]]
                return from_local(tree[2], t.device_mesh, t.placements, shape=t.shape, sharding_shapes=t.shard_sizes(),
                                  _trusted_sizes=True)
            if isinstance(tree, dict):
                return {k: rewrap(v) for k, v in tree.items()}
            if isinstance(tree, (list, tuple)):
                return type(tree)(rewrap(v) for v in tree)
            return tree

        # torch's code stages each local piece (pinned or shared memory as asked), then each
        # stage is wrapped in its tensor's layout.
        staged = create(_map_shard_tensors(state_dict, strip), *args, **kwargs)
        return rewrap(staged)

    _create_cpu_state_dict._shardtensor = True
    utils._create_cpu_state_dict = _create_cpu_state_dict
    after_import("torch.distributed.checkpoint.staging",
                 lambda module: setattr(module, "_create_cpu_state_dict", _create_cpu_state_dict)
                 if getattr(module, "_create_cpu_state_dict", None) is create else None)


def _wrap_gather(utils) -> None:
    """Wraps torch's _gather_state_dict (full_state_dict=True) where the state-dict utilities use it."""
    gather = getattr(utils, "_gather_state_dict", None)
    if gather is None or getattr(gather, "_shardtensor", False):
        return  # another torch layout: its full state dicts keep ShardTensors

    def _gather_state_dict(state_dict, *args, **kwargs):
        return gather(_map_shard_tensors(state_dict, _full_tensor), *args, **kwargs)

    _gather_state_dict._shardtensor = True
    utils._gather_state_dict = _gather_state_dict
    # state_dict.py imported the name from utils before the wrap (it imports utils first).
    after_import("torch.distributed.checkpoint.state_dict",
                 lambda module: setattr(module, "_gather_state_dict", _gather_state_dict)
                 if getattr(module, "_gather_state_dict", None) is gather else None)


def install() -> None:
    """The DCP protocol on torch.Tensor now; the state-dict gather once torch loads it."""
    T = torch.Tensor
    for name, method in _PROTOCOL.items():
        if name in T.__dict__:
            if getattr(getattr(T.__dict__[name], "fget", None), "_shardtensor", False):
                continue
            raise RuntimeError(f"shardtensor: torch.Tensor already has {name!r} in torch {torch.__version__}")
        attribute = _protocol_property(method)
        attribute.fget._shardtensor = True
        setattr(T, name, attribute)
    after_import("torch.distributed._state_dict_utils", _wrap_gather)
    after_import("torch.distributed._state_dict_utils", _wrap_create_cpu_state_dict)
