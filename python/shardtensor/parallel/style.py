"""DTensor's parallel styles (torch.distributed.tensor.parallel.style) over ShardTensors.

Each style partitions a module's parameters (torch.chunk sizes, so a mesh that does not
divide a size gives uneven pieces, empty ones included) and installs forward hooks that turn
plain inputs into ShardTensors (from_local on ``input_layouts``), redistribute them to the
layout the module computes on, and turn outputs into ``output_layouts`` (and back into local
tensors with ``use_local_output``). ShardTensor inputs are taken as they are and redistributed
where their layout differs.

Where a plain local input is split, its global size comes from the module when the module
knows it (RowwiseParallel's Shard(-1) input has the sizes of its weight's Shard(1) pieces), and
from one small all-gather of shapes otherwise (``sharding_shapes="infer"``).
"""

from __future__ import annotations

import abc

import torch
from torch import nn

from .. import _C, _placements
from .._placements import Replicate, Shard
from .._tensor import distribute_tensor, from_local, is_shard_tensor
from .._distribute_module import distribute_module

__all__ = ["ColwiseParallel", "ParallelStyle", "PrepareModuleInput", "PrepareModuleInputOutput", "PrepareModuleOutput",
           "RowwiseParallel", "SequenceParallel"]


# ---- layouts ---------------------------------------------------------------------------------

def _ours(placement):
    """A placement (ours or torch's) as shardtensor's."""
    return _placements.decode(_placements.encode([placement]))[0]


def _layouts(layouts):
    """None, one placement, or a tuple of placements (None entries kept) as a tuple of ours."""
    if layouts is None:
        return None
    if hasattr(layouts, "is_shard"):
        return (_ours(layouts),)
    return tuple(None if p is None else _ours(p) for p in layouts)


def _normalized(placement, ndim: int):
    if torch.compiler.is_compiling():
        # A placement is a constant of the trace, which dynamo cannot build from the integers
        # it may have made symbolic; a negative dim counts from the end in the layout too.
        return placement
    return Shard(placement.dim % ndim) if placement.is_shard() and ndim > 0 else placement


def _as_shard_tensor(t, mesh, placement, sizes=None):
    """`t` as a ShardTensor on `mesh`: a ShardTensor as it is, a plain tensor as this rank's piece
    of a tensor laid out by `placement`. `sizes` (every rank's piece along the split dim) gives
    the global size of a split piece; without them one small all-gather infers it."""
    if is_shard_tensor(t):
        if t.device_mesh != mesh:
            raise ValueError(f"parallel style: an input is a ShardTensor on {t.device_mesh}, but the module is "
                             f"parallelized over {mesh}; redistribute it onto that mesh first")
        return t
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"parallel style: expected a torch.Tensor input, got {type(t).__name__}")
    if placement.is_replicate() and not t.requires_grad:
        # Every rank holds the whole tensor: each keeps its own, with no message (from_local
        # would also compare the ranks' layouts, one small all-gather).
        return distribute_tensor(t, mesh, [Replicate()], src_data_rank=None)
    if placement.is_shard():
        dim = placement.dim % t.ndim
        if sizes is None:
            return from_local(t, mesh, [Shard(dim)], sharding_shapes="infer")
        shape = list(t.shape)
        shape[dim] = sum(sizes)
        # The sizes are the module's own weight pieces, the same on every rank by construction:
        # no agreement all-gather (a rank whose piece does not match still raises).
        return from_local(t, mesh, [Shard(dim)], sharding_shapes={dim: list(sizes)}, shape=shape, _trusted_sizes=True)
    return from_local(t, mesh, [placement])


def _redistributed(t, mesh, placement, sizes=None):
    """`t` laid out by `placement` (with `sizes` along its split dim, where given)."""
    target = _normalized(placement, t.ndim)
    dim = target.dim % t.ndim if target.is_shard() else None
    if t.placements == (target,) and (sizes is None or t.shard_sizes().get(dim) == list(sizes)):
        return t
    shapes = {dim: list(sizes)} if sizes is not None else None
    return t.redistribute(mesh, [target], sharding_shapes=shapes)


def _output(outputs, mesh, placement, use_local_output):
    if is_shard_tensor(outputs):
        outputs = _redistributed(outputs, mesh, placement)
        return outputs.to_local() if use_local_output else outputs
    return outputs


def _parameter(param, mesh, placement, src_data_rank):
    """An nn.Parameter holding `param` laid out by `placement` (torch.chunk sizes)."""
    if is_shard_tensor(param):
        sharded = _redistributed(param.detach(), mesh, placement)
    else:
        sharded = distribute_tensor(param.detach(), mesh, [placement], src_data_rank=src_data_rank)
    return nn.Parameter(sharded, requires_grad=param.requires_grad)


def _supported(style: str, module: nn.Module):
    if not isinstance(module, (nn.Linear, nn.Embedding)):
        raise NotImplementedError(f"{style} supports nn.Linear and nn.Embedding (as DTensor's), got "
                                  f"{type(module).__module__}.{type(module).__name__}; write the layout of other "
                                  f"modules with distribute_module(module, mesh, partition_fn, input_fn, output_fn)")


# ---- the styles ------------------------------------------------------------------------------

class ParallelStyle(abc.ABC):
    """How parallelize_module parallelizes one module: ``_apply(module, device_mesh)``."""

    src_data_rank: int | None = 0

    @abc.abstractmethod
    def _apply(self, module: nn.Module, device_mesh) -> nn.Module: ...


class _LinearStyle(ParallelStyle):
    """What ColwiseParallel and RowwiseParallel share: nn.Linear / nn.Embedding only, partitioned by
    ``_partition``, inputs by ``_prepare_input``, outputs to ``output_layouts``."""

    def _prepare_output(self, module, outputs, mesh):
        return _output(outputs, mesh, self.output_layouts[0], self.use_local_output)

    def _apply(self, module, device_mesh):
        _supported(type(self).__name__, module)
        return distribute_module(module, device_mesh, self._partition, self._prepare_input, self._prepare_output)

    def __repr__(self):
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts={self.output_layouts}, "
                f"use_local_output={self.use_local_output})")


class ColwiseParallel(_LinearStyle):
    """Splits nn.Linear's output features (weight and bias Shard(0)) or nn.Embedding's embedding
    dim (weight Shard(1)). Input: ``input_layouts`` (default Replicate()), redistributed to
    Replicate. Output: Shard(-1), redistributed to ``output_layouts`` (default Shard(-1)),
    local when ``use_local_output``."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output: bool = True):
        super().__init__()
        self.input_layouts = (_ours(input_layouts or Replicate()),)
        self.output_layouts = (_ours(output_layouts or Shard(-1)),)
        self.desired_input_layouts = (Replicate(),)
        self.use_local_output = use_local_output

    def _partition(self, name, module, mesh):
        placement = Shard(0) if isinstance(module, nn.Linear) else Shard(1)
        for param_name, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(param_name, _parameter(param, mesh, placement, self.src_data_rank))

    def _prepare_input(self, module, inputs, mesh):
        x = _as_shard_tensor(inputs[0], mesh, self.input_layouts[0])
        return (_redistributed(x, mesh, self.desired_input_layouts[0]), *inputs[1:])



class RowwiseParallel(_LinearStyle):
    """Splits nn.Linear's input features (weight Shard(1), bias Replicate) or nn.Embedding's
    vocabulary (weight Shard(0): each rank looks up its own rows into a pending sum). Input:
    ``input_layouts`` (default Shard(-1), pieces sized as the weight's), redistributed to Shard(-1)
    for Linear and to Replicate for Embedding. Output: Partial(sum), redistributed to
    ``output_layouts`` (default Replicate(): one all-reduce; Shard(d): one reduce-scatter),
    local when ``use_local_output``."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output: bool = True):
        super().__init__()
        self.input_layouts = (_ours(input_layouts or Shard(-1)),)
        self.output_layouts = (_ours(output_layouts or Replicate()),)
        self.use_local_output = use_local_output

    def _partition(self, name, module, mesh):
        if isinstance(module, nn.Linear):
            module.register_parameter("weight", _parameter(module.weight, mesh, Shard(1), self.src_data_rank))
            if module.bias is not None:
                module.register_parameter("bias", _parameter(module.bias, mesh, Replicate(), self.src_data_rank))
        else:
            for param_name, param in list(module.named_parameters(recurse=False)):
                module.register_parameter(param_name, _parameter(param, mesh, Shard(0), self.src_data_rank))

    def _prepare_input(self, module, inputs, mesh):
        x, layout = inputs[0], self.input_layouts[0]
        if not isinstance(module, nn.Linear):
            x = _as_shard_tensor(x, mesh, layout)
            return (_redistributed(x, mesh, Replicate()), *inputs[1:])
        # The input's last dim meets the weight's split dim 1: its pieces have the weight's sizes.
        sizes = module.weight.shard_sizes()[1]
        splits_last = layout.is_shard() and isinstance(x, torch.Tensor) and layout.dim % x.ndim == x.ndim - 1
        x = _as_shard_tensor(x, mesh, layout, sizes if splits_last else None)
        return (_redistributed(x, mesh, Shard(-1), sizes), *inputs[1:])



class SequenceParallel(ParallelStyle):
    """Replicates the module's parameters (from rank 0) and runs it on its input split along
    ``sequence_dim`` (any split: 13 positions over 4 ranks is 4, 4, 4, 1). A plain input is taken
    as this rank's piece of the sequence (its length inferred with one small all-gather); a
    ShardTensor input is redistributed to Shard(sequence_dim). For modules that compute position
    by position: nn.LayerNorm, nn.Dropout, RMSNorm."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False):
        super().__init__()
        self.sequence_sharding = (Shard(sequence_dim),)
        self.use_local_output = use_local_output

    def _replicate(self, name, module, mesh):
        for param_name, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(param_name, _parameter(param, mesh, Replicate(), self.src_data_rank))

    def _prepare_input(self, module, inputs, mesh):
        if not isinstance(inputs[0], torch.Tensor):
            raise ValueError(f"SequenceParallel: expected the input of {type(module).__name__} to be a torch.Tensor or "
                             f"a ShardTensor, got {type(inputs[0]).__name__}")
        x = _as_shard_tensor(inputs[0], mesh, self.sequence_sharding[0])
        return (_redistributed(x, mesh, self.sequence_sharding[0]), *inputs[1:])

    def _prepare_output(self, module, outputs, mesh):
        return outputs.to_local() if self.use_local_output and is_shard_tensor(outputs) else outputs

    def _apply(self, module, device_mesh):
        return distribute_module(module, device_mesh, self._replicate, self._prepare_input, self._prepare_output)

    def __repr__(self):
        return (f"{type(self).__name__}(sequence_dim={self.sequence_sharding[0].dim}, "
                f"use_local_output={self.use_local_output})")


def _prepare(value, mesh, layout, desired, use_local: bool):
    """One input or output of PrepareModuleInput/Output: annotated with `layout`, redistributed to
    `desired`; untouched where `layout` is None."""
    if layout is None:
        return value
    x = _as_shard_tensor(value, mesh, layout)
    if desired is not None:
        x = _redistributed(x, mesh, desired)
    return x.to_local() if use_local else x


class PrepareModuleInput(ParallelStyle):
    """Lays the module's inputs out at run time: each positional input (and each keyword input
    named in ``input_kwarg_layouts``) is annotated with its ``input_layouts`` entry (a plain
    tensor is this rank's piece) and redistributed to its ``desired_input_layouts`` entry; None
    entries pass through. ShardTensors are passed on unless ``use_local_output``."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_output: bool = False):
        self.input_layouts = _layouts(input_layouts)
        self.desired_input_layouts = _layouts(desired_input_layouts)
        self.use_local_output = use_local_output
        if self.input_layouts is not None:
            if self.desired_input_layouts is None:
                raise ValueError("PrepareModuleInput: input_layouts is given but desired_input_layouts is not; give "
                                 "one desired layout (or None) per input")
            if len(self.input_layouts) != len(self.desired_input_layouts):
                raise ValueError(f"PrepareModuleInput: {len(self.input_layouts)} input_layouts but "
                                 f"{len(self.desired_input_layouts)} desired_input_layouts; give one per input")
        self.with_kwargs = input_kwarg_layouts is not None
        self.input_kwarg_layouts = {k: _ours(v) for k, v in (input_kwarg_layouts or {}).items()}
        self.desired_input_kwarg_layouts = {k: _ours(v) for k, v in (desired_input_kwarg_layouts or {}).items()}
        if self.with_kwargs and len(self.input_kwarg_layouts) != len(self.desired_input_kwarg_layouts):
            raise ValueError("PrepareModuleInput: input_kwarg_layouts and desired_input_kwarg_layouts name different "
                             "numbers of keyword inputs; give a desired layout for each")

    def _prepare_inputs(self, inputs, mesh):
        if self.input_layouts is None:
            return inputs
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        if len(inputs) != len(self.input_layouts):
            raise ValueError(f"PrepareModuleInput: the module got {len(inputs)} positional inputs but input_layouts "
                             f"has {len(self.input_layouts)} entries; give one per input (None for those left alone)")
        return tuple(_prepare(x, mesh, layout, desired, self.use_local_output)
                     for x, layout, desired in zip(inputs, self.input_layouts, self.desired_input_layouts))

    def _prepare_kwarg_inputs(self, inputs, kwargs, mesh):
        kwargs = {k: _prepare(v, mesh, self.input_kwarg_layouts.get(k), self.desired_input_kwarg_layouts.get(k),
                              self.use_local_output) for k, v in kwargs.items()}
        return self._prepare_inputs(inputs, mesh), kwargs

    def _apply(self, module, device_mesh):
        if self.with_kwargs:
            module.register_forward_pre_hook(
                lambda _, inputs, kwargs: self._prepare_kwarg_inputs(inputs, kwargs, device_mesh), with_kwargs=True)
        else:
            module.register_forward_pre_hook(lambda _, inputs: self._prepare_inputs(inputs, device_mesh))
        return module

    def __repr__(self):
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, desired_input_layouts="
                f"{self.desired_input_layouts}, input_kwarg_layouts={self.input_kwarg_layouts}, "
                f"desired_input_kwarg_layouts={self.desired_input_kwarg_layouts}, "
                f"use_local_output={self.use_local_output})")


class PrepareModuleOutput(ParallelStyle):
    """Lays the module's outputs out at run time: each output is annotated with its
    ``output_layouts`` entry (a plain tensor is this rank's piece) and redistributed to its
    ``desired_output_layouts`` entry; None entries pass through. Local when ``use_local_output``."""

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output: bool = True):
        self.output_layouts = _layouts(output_layouts)
        self.desired_output_layouts = _layouts(desired_output_layouts)
        self.use_local_output = use_local_output
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise ValueError(f"PrepareModuleOutput: {len(self.output_layouts)} output_layouts but "
                             f"{len(self.desired_output_layouts)} desired_output_layouts; give one per output")

    def _prepare_outputs(self, outputs, mesh):
        single = not isinstance(outputs, tuple)
        outputs = (outputs,) if single else outputs
        if len(outputs) != len(self.output_layouts):
            raise ValueError(f"PrepareModuleOutput: the module returned {len(outputs)} outputs but output_layouts has "
                             f"{len(self.output_layouts)} entries; give one per output (None for those left alone)")
        prepared = tuple(_prepare(out, mesh, layout, desired, self.use_local_output)
                         for out, layout, desired in zip(outputs, self.output_layouts, self.desired_output_layouts))
        return prepared[0] if len(prepared) == 1 else prepared

    def _apply(self, module, device_mesh):
        module.register_forward_hook(lambda _, inputs, outputs: self._prepare_outputs(outputs, device_mesh))
        return module

    def __repr__(self):
        return (f"{type(self).__name__}(output_layouts={self.output_layouts}, desired_output_layouts="
                f"{self.desired_output_layouts}, use_local_output={self.use_local_output})")


class PrepareModuleInputOutput(ParallelStyle):
    """PrepareModuleInput and PrepareModuleOutput on one module (``use_local_input`` is the
    former's ``use_local_output``)."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_input: bool = False, output_layouts,
                 desired_output_layouts, use_local_output: bool = True):
        self.prepare_module_input = PrepareModuleInput(
            input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts, desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input)
        self.prepare_module_output = PrepareModuleOutput(
            output_layouts=output_layouts, desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output)

    def _apply(self, module, device_mesh):
        self.prepare_module_input._apply(module, device_mesh)
        self.prepare_module_output._apply(module, device_mesh)
        return module

    def __repr__(self):
        return f"{type(self).__name__}({self.prepare_module_input!r}, {self.prepare_module_output!r})"
