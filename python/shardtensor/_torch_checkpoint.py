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
result holds plain whole tensors, as it does for DTensor models.
"""

from __future__ import annotations

import torch

from . import _C
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


def _full_tensors(tree):
    """Every ShardTensor in a (nested) state dict made its full tensor; the rest as it is."""
    if isinstance(tree, torch.Tensor) and _C.is_shard_tensor(tree):
        _refuse_partial(tree, "full_state_dict")
        return tree.full_tensor()
    if isinstance(tree, dict):
        return {k: _full_tensors(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_full_tensors(v) for v in tree)
    return tree


def _wrap_gather(utils) -> None:
    """Wraps torch's _gather_state_dict (full_state_dict=True) where the state-dict utilities use it."""
    gather = getattr(utils, "_gather_state_dict", None)
    if gather is None or getattr(gather, "_shardtensor", False):
        return  # another torch layout: its full state dicts keep ShardTensors

    def _gather_state_dict(state_dict, *args, **kwargs):
        return gather(_full_tensors(state_dict), *args, **kwargs)

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
            if getattr(T.__dict__[name].fget, "_shardtensor", False):
                continue
            raise RuntimeError(f"shardtensor: torch.Tensor already has {name!r} in torch {torch.__version__}")
        attribute = _protocol_property(method)
        attribute.fget._shardtensor = True
        setattr(T, name, attribute)
    after_import("torch.distributed._state_dict_utils", _wrap_gather)
