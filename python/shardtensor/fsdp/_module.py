"""fully_shard and the FSDPModule methods it adds (FSDP2's API), over FSDPParam.

A forward pre-hook registers each managed parameter's unsharded form on the modules that hold
it (what the module's code reads as ``self.weight``) and the forward hook puts the sharded one
back, so between steps ``parameters()``, ``state_dict()`` and optimizers see the sharded
ShardTensors. With reshard_after_forward, autograd keeps notes instead of the unsharded tensors
(_reshard.py); each gradient is reduce-scattered as soon as autograd has it (FSDPParam.reduce).

Under torch.compile the gathers are traced instead (SimpleFSDP's form): while dynamo traces a
forward of a fully sharded module, the hooks register nothing, and each managed attribute (a
property of the owner's class) reads as the parameter all-gathered in the graph, whose backward
reduce-scatters its gradient in the graph too (FSDPParam.gathered_in_graph); so Inductor sees
every collective of the step. Where the traced form would not mean what the hooks do (gradient
sync off, an explicit unshard(), a reduce_dtype other than param_dtype) the hooks run eagerly,
as FSDP2's do under dynamo.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

from .. import _C
from .._mesh import DeviceMesh
from . import _prefetch, _reshard
from ._param import FSDPParam


class FSDPModule:
    """What ``fully_shard`` adds to a module's class (as FSDP2's FSDPModule): ``FSDPLinear`` for
    an ``nn.Linear``. isinstance(module, shardtensor.fsdp.FSDPModule) tells them apart."""

    def unshard(self, async_op: bool = False):
        """Registers the unsharded parameters (all-gathered) until ``reshard()``: the next
        forwards use them without gathering. With ``async_op`` the gathers run on the prefetch
        stream and the returned handle's ``wait()`` registers them (the module's next forward
        waits for it if the program did not); else they are registered now and None returned."""
        state = self._fsdp_state
        state.explicitly_unsharded = True
        if not async_op:
            state.register(unsharded=True)
            return None
        state.start_gathers()
        state.pending_unshard = UnshardHandle(state)
        return state.pending_unshard

    def set_modules_to_forward_prefetch(self, modules) -> None:
        """FSDP2's: at each forward of this module, once its own parameters are gathered, the
        all-gathers of ``modules`` start in the background, to overlap this module's compute.
        Collective (call it on every rank, in one order): it makes the prefetch stream's process
        groups the first time."""
        self._fsdp_state.forward_prefetch = _prefetch_targets(modules, "set_modules_to_forward_prefetch")

    def set_modules_to_backward_prefetch(self, modules) -> None:
        """FSDP2's: when this module's backward begins, the all-gathers the backwards of
        ``modules`` need again (those that reshard after forward) start in the background.
        Collective, as set_modules_to_forward_prefetch."""
        self._fsdp_state.backward_prefetch = _prefetch_targets(modules, "set_modules_to_backward_prefetch")

    def reshard(self) -> None:
        """Registers the sharded parameters again (after ``unshard()``)."""
        self._fsdp_state.explicitly_unsharded = False
        self._fsdp_state.register(unsharded=False)

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """Off: backwards keep each rank's gradient term unreduced (gradient accumulation without
        communication); the next backward with it on adds them in and reduces once."""
        for state in self._fsdp_states(recurse):
            for p in state.params:
                p.requires_gradient_sync = bool(requires_gradient_sync)

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(f"set_reshard_after_forward: expected a bool, got {reshard_after_forward!r}")
        for state in self._fsdp_states(recurse):
            state.reshard_after_forward = reshard_after_forward

    def _fsdp_states(self, recurse: bool):
        modules = self.modules() if recurse else [self]
        return [m._fsdp_state for m in modules if isinstance(m, FSDPModule)]


class UnshardHandle:
    """FSDP2's: what ``unshard(async_op=True)`` returns; ``wait()`` registers the gathered
    parameters."""

    def __init__(self, state):
        self._state = state

    def wait(self) -> None:
        state, self._state = self._state, None
        if state is not None and state.pending_unshard is self:
            state.pending_unshard = None
            state.register(unsharded=True)


def _prefetch_targets(modules, call: str) -> list:
    modules = list(modules)
    for m in modules:
        if not isinstance(m, FSDPModule):
            raise ValueError(f"{call}: expected fully sharded modules (FSDPModule), got {type(m).__name__}")
    for m in modules:
        m._fsdp_state.make_twins()
    return modules


class _FSDPState:
    def __init__(self, params: list[FSDPParam], reshard_after_forward, mp_policy):
        self.params, self.mp_policy = params, mp_policy
        self.reshard_after_forward = reshard_after_forward
        self.explicitly_unsharded = False
        self.pending_unshard = None  # unshard(async_op=True)'s handle until waited on
        self.forward_prefetch: list = []  # modules whose gathers this one's forward starts
        self.backward_prefetch: list = []  # ... and its backward
        self.hooks = None  # a running eager forward's saved-tensor hooks (reshard_after_forward)

    # ---- prefetch (_prefetch.py) ---------------------------------------------------------
    def make_twins(self) -> None:
        for p in self.params:
            if p.twin is None:
                p.twin = _prefetch.twin_mesh(p.mesh_root, p.mesh_dims)

    def start_gathers(self) -> None:
        self.make_twins()
        for p in self.params:
            p.start_gather()

    def prefetch_forward(self) -> None:
        for m in self.forward_prefetch:
            target = m._fsdp_state
            if not target.explicitly_unsharded:
                target.start_gathers()

    def prefetch_backward(self) -> None:
        for m in self.backward_prefetch:
            target = m._fsdp_state
            if target.reshard_after_forward and not target.explicitly_unsharded:
                for p in target.params:
                    if p.needs_regather():
                        p.start_gather()

    def gathers_in_graph(self) -> bool:
        """Whether a traced forward gathers the parameters in its graph: only where that means
        what the eager hooks do (each backward reduces, in param_dtype, with no unreduced term
        left from a backward without sync; no unshard() holds them). dynamo guards on what this
        reads, so a change recompiles."""
        policy = self.mp_policy
        return (not self.explicitly_unsharded
                and all(p.requires_gradient_sync and p.pending_grad is None for p in self.params)
                and (policy.reduce_dtype is None or policy.reduce_dtype == policy.param_dtype))

    def register(self, unsharded: bool) -> list:
        values = [p.unsharded() if unsharded else p.sharded for p in self.params]
        for p, value in zip(self.params, values):
            for module, name in p.owners:
                module._parameters[name] = value  # not setattr: the unsharded one is not a Parameter
        return values


def _cast_floating(tree, dtype):
    return torch.utils._pytree.tree_map_only(
        torch.Tensor, lambda t: t.to(dtype) if torch.is_floating_point(t) else t, tree)


# Forwards of fully sharded modules running now, outermost first: the first is the root.
_RUNNING: list = []


def _pre_forward(module, args, kwargs):
    state = module._fsdp_state
    if torch.compiler.is_compiling() and state.gathers_in_graph():
        for p in state.params:  # their attributes read as gathered in the graph (_parameter_property)
            p.in_traced_forward = True
        return _cast_inputs(state, args, kwargs)
    return _pre_forward_eagerly(module, args, kwargs)


def _post_forward(module, args, output):
    state = module._fsdp_state
    if torch.compiler.is_compiling() and state.gathers_in_graph():
        for p in state.params:
            p.in_traced_forward = False
        return _cast_output(state, output)
    return _post_forward_eagerly(module, args, output)


def _cast_inputs(state, args, kwargs):
    policy = state.mp_policy
    if policy.param_dtype is not None and policy.cast_forward_inputs:
        args, kwargs = _cast_floating((args, kwargs), policy.param_dtype)
    return args, kwargs


def _cast_output(state, output):
    if state.mp_policy.output_dtype is not None:
        output = _cast_floating(output, state.mp_policy.output_dtype)
    return output


# The eager hooks rebind module parameters and keep Python state (the running forwards, the
# saved-tensor hooks), which a graph cannot hold: under torch.compile they run between graphs,
# as FSDP2's do (dynamo's skip_fsdp_hooks), where the traced form does not apply.
@torch.compiler.disable
def _pre_forward_eagerly(module, args, kwargs):
    state = module._fsdp_state
    if state.reshard_after_forward is None:  # FSDP2's default: the root keeps them, the others do not
        state.reshard_after_forward = bool(_RUNNING)
    _RUNNING.append(module)
    state.hooks = None
    if state.pending_unshard is not None:
        state.pending_unshard.wait()
    if not state.explicitly_unsharded:
        unsharded = state.register(unsharded=True)
        if state.reshard_after_forward and torch.is_grad_enabled():
            state.hooks = (_reshard.enter(state.params, unsharded), unsharded)
    state.prefetch_forward()
    return _cast_inputs(state, args, kwargs)


@torch.compiler.disable
def _post_forward_eagerly(module, args, output):
    state = module._fsdp_state
    for p in state.params:  # a traced forward that raised past its own post-hook left them set
        p.in_traced_forward = False
    if _RUNNING and _RUNNING[-1] is module:
        _RUNNING.pop()
    if state.hooks is not None:
        hooks, unsharded = state.hooks
        _reshard.leave(hooks, unsharded)
        state.hooks = None
    if not state.explicitly_unsharded:
        state.register(unsharded=False)
    if not _RUNNING:  # the root's forward ended: a module prefetched for and not run lets go
        _prefetch.discard_pending()
    if state.backward_prefetch and torch.is_grad_enabled():
        _prefetch_when_backward_begins(state, output)
    return _cast_output(state, output)


def _prefetch_when_backward_begins(state, output) -> None:
    """FSDP2's pre-backward point: the first gradient of the module's outputs to arrive starts
    its backward prefetch; at the end of that backward, prefetches nobody took let go."""
    outputs = [t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
    fired = []

    def begin(_grad):
        if not fired:
            fired.append(True)
            state.prefetch_backward()
            torch.autograd.Variable._execution_engine.queue_callback(_prefetch.discard_pending)

    for t in outputs:
        t.register_hook(begin)


def _parameter_property(name: str) -> property:
    """The managed attribute `name` of an owner module: what its class reads as ``self.<name>``.
    Eagerly it is what the hooks registered (the unsharded parameter during a forward, the
    sharded one otherwise); while dynamo traces a forward that gathers in its graph, the
    parameter gathered there."""

    def get(module):
        value = module._parameters[name]
        param = getattr(value, "_fsdp_param", None)  # registered sharded: outside a forward, or traced
        if param is not None and param.in_traced_forward:
            if torch.compiler.is_compiling():
                return param.gathered_in_graph()
            # Code run eagerly inside a traced forward (a graph break) would compute with the
            # sharded parameter: refuse it rather than give other values than the model's.
            raise RuntimeError(
                f"fully_shard: {type(module).__name__}.{name} ({param.fqn}) was read outside the graph of a compiled "
                f"forward that gathers it in the graph: the forward broke its graph where it reads the parameter. "
                f"Remove the graph break (torch._dynamo.explain shows it), or compile the module's blocks separately")
        return value

    return property(get)


_OWNER_CLASSES: dict = {}


def _with_parameter_properties(module: nn.Module, names) -> None:
    """Gives module's class a property per managed attribute name (a subclass, one per class and
    set of names, same name and module; isinstance checks hold)."""
    cls = type(module)
    missing = tuple(sorted(n for n in names if not isinstance(getattr(cls, n, None), property)))
    if not missing:
        return
    key = (cls, missing)
    if key not in _OWNER_CLASSES:
        _OWNER_CLASSES[key] = type(cls.__name__, (cls,), {
            "__module__": cls.__module__, **{n: _parameter_property(n) for n in missing}})
    module.__class__ = _OWNER_CLASSES[key]


_FSDP_CLASSES: dict = {}


def _fsdp_class(cls):
    if cls not in _FSDP_CLASSES:
        _FSDP_CLASSES[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {"__module__": cls.__module__})
    return _FSDP_CLASSES[cls]


def _managed_parameters(module: nn.Module, ignored):
    """{parameter: [(owner, name), ...]} of module's subtree that no inner fully_shard manages."""
    owners: dict = {}
    fqns: dict = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for name, param in sub._parameters.items():
            if param is None or param in ignored or getattr(param, "_fsdp_param", None) is not None:
                continue
            owners.setdefault(param, []).append((sub, name))
            fqns.setdefault(param, f"{prefix}.{name}" if prefix else name)
    return owners, fqns


def fully_shard(module: nn.Module, *, mesh: DeviceMesh | None = None, reshard_after_forward: bool | None = None,
                mp_policy: MixedPrecisionPolicy = MixedPrecisionPolicy(), offload_policy: OffloadPolicy = OffloadPolicy(),
                ignored_params: set | None = None) -> nn.Module:
    """FSDP2's fully_shard for ShardTensor and plain parameters: each parameter of ``module`` that
    no earlier call on a submodule took becomes a ShardTensor split on dim 0 over ``mesh`` (1-D:
    ``Shard(0)``; 2-D, HSDP: ``(Replicate(), Shard(0))``), nested inside the layout tensor
    parallelism gave it, any sizes, unevenly, without padding. Forward all-gathers them and
    backward reduce-scatters the gradients, averaged over the data-parallel ranks, in
    ``mp_policy``'s dtypes. Returns ``module``, its class now also an FSDPModule.

    The meanings are FSDP2's: with ``reshard_after_forward`` (by default for every module but
    the root) the unsharded parameters are not kept from forward to backward, which gathers
    them again. One difference in how, not in values: each parameter is gathered by itself,
    not in one flat buffer per module.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"fully_shard: expected an nn.Module, got {type(module).__name__} (a list of modules is not "
                        f"supported: call fully_shard on each)")
    if isinstance(module, FSDPModule):
        raise ValueError(f"fully_shard: the module {type(module).__name__} is already fully sharded; call fully_shard "
                         f"once per module, bottom-up")
    if mesh is None:
        raise ValueError("fully_shard: pass the data-parallel mesh (mesh=device_mesh['dp'])")
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"fully_shard: mesh must be a shardtensor DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim not in (1, 2):
        raise ValueError(f"fully_shard: mesh must be 1-D (FSDP) or 2-D (HSDP: ('replicate', 'shard')), got {mesh}")
    if mesh.get_coordinate() is None:
        raise ValueError(f"fully_shard: the mesh {mesh} does not include this rank ({_C.world_rank()}); every rank "
                         f"that calls fully_shard must be on the data-parallel mesh")
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"fully_shard: mp_policy must be a torch.distributed.fsdp.MixedPrecisionPolicy, got "
                        f"{type(mp_policy).__name__}")
    if isinstance(offload_policy, CPUOffloadPolicy):
        raise NotImplementedError("fully_shard: CPUOffloadPolicy is not supported; pass OffloadPolicy() (no offload)")
    ignored = set(ignored_params or ())
    owners, fqns = _managed_parameters(module, ignored)
    for param in owners:
        if param.dim() == 0:
            raise ValueError(f"fully_shard: parameter {fqns[param]!r} is a scalar; FSDP shards dim 0 (make it a 1-D "
                             f"tensor of one element)")
    params = [FSDPParam(fqns[p], p, owners[p], mesh, mp_policy) for p in owners]
    names_of: dict = {}  # owner module -> the attribute names it holds managed parameters under
    for p in params:
        for owner, name in p.owners:
            owner._parameters[name] = p.sharded
            names_of.setdefault(owner, set()).add(name)
    module._fsdp_state = _FSDPState(params, reshard_after_forward, mp_policy)
    module.__class__ = _fsdp_class(type(module))
    for owner, names in names_of.items():
        _with_parameter_properties(owner, names)
    module.register_forward_pre_hook(_pre_forward, with_kwargs=True)
    module.register_forward_hook(_post_forward, always_call=True)  # also when the forward raises
    return module
