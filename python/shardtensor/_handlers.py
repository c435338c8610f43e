"""PhysicsNeMo's handler registries: Python code that takes over an operator or a function
when ShardTensors reach it.

    ShardTensor.register_dispatch_handler(torch.ops.aten.add.Tensor, handler)   # handler(*args, **kwargs)
    ShardTensor.register_function_handler(F.conv1d, handler)        # handler(func, types, args, kwargs)
    ShardTensor.register_named_function_handler("mylib.op.default", handler)   # a torch.library op
    ShardTensor.register_named_function_handler("torch.nn.functional.gelu", handler)  # a Python path

Only what has a handler pays a Python call; every other operator still dispatches in C++:
- a dispatch handler is a kernel registered with torch's dispatcher (torch.library) for that
  one operator, on the dispatch key ShardTensors carry, below autograd (PhysicsNeMo's
  ``__torch_dispatch__`` level): gradients come from the operator's own derivative, whose
  backward operators reach their own rules or handlers. For the few operators whose
  shardtensor kernel sits above autograd (linear, dist, ...), the handler does too and is
  differentiated through the operators it calls.
- a function handler replaces the function where torch keeps it (``torch.nn.functional.conv1d``
  and every other name of the same object in torch, torch.nn.functional, torch.Tensor,
  torch.linalg, torch.special, torch.fft): the replacement calls the handler when a ShardTensor
  is among the arguments and the original otherwise. It runs above autograd (PhysicsNeMo's
  ``__torch_function__`` level): a handler written with differentiable operations gets
  gradients through them, one written as an ``autograd.Function`` gets its own backward.

The registries are dicts, as in PhysicsNeMo, and the dispatcher follows them: setting, deleting
or replacing an entry (or assigning a saved copy back to ``ShardTensor._dispatch_registry``)
installs or removes the kernel or the replacement at once, restoring what ran before.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Callable

import torch

from . import _C

_SHARD_TYPES: tuple = ()  # (ShardTensor,), set by _tensor on import (the `types` handlers get)

# Where a function handler looks for the names of a function object.
_FUNCTION_HOMES = ("torch", "torch.nn.functional", "torch.linalg", "torch.special", "torch.fft")

# Set False to let every patched function run its original (PhysicsNeMo's switch; dispatch
# handlers and custom-op handlers are kernels, not patches, and stay on).
patches = {"enabled": True}


def _has_shard_tensor(args, kwargs) -> bool:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            if _C.is_shard_tensor(value):
                return True
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor) and _C.is_shard_tensor(item):
                    return True
    return False


def _callable(handler, what: str) -> Callable:
    if not callable(handler):
        raise TypeError(f"{what}: the handler must be callable, got {type(handler).__name__}")
    return handler


# ---- operators ------------------------------------------------------------------------------

def resolve_operator(op, what: str) -> torch._ops.OpOverload:
    """An OpOverload from an OpOverload, or a name: "aten::add.Tensor", "aten.add.Tensor",
    "mylib::op" (the default overload)."""
    if isinstance(op, torch._ops.OpOverload):
        return op
    if isinstance(op, torch._ops.OpOverloadPacket):
        raise ValueError(f"{what}: {op} names several overloads ({', '.join(op.overloads())}); pass one, "
                         f"e.g. {op}.{op.overloads()[0]}")
    if not isinstance(op, str):
        raise TypeError(f"{what}: expected a torch.ops OpOverload or its name ('aten::add.Tensor'), got {type(op).__name__}")
    name = op.replace("::", ".", 1)
    parts = name.split(".")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"{what}: {op!r} is not an operator name; write 'namespace::name' or 'namespace::name.overload'")
    namespace, op_name, overload = parts[0], parts[1], parts[2] if len(parts) == 3 else "default"
    try:
        return getattr(getattr(getattr(torch.ops, namespace), op_name), overload)
    except (AttributeError, RuntimeError):
        raise ValueError(f"{what}: no operator {op!r} is registered with torch's dispatcher "
                         f"(looked for {namespace}::{op_name}, overload '{overload}')") from None


def qualified(op: torch._ops.OpOverload) -> str:
    name = op._schema.name
    return name + ("." + op._schema.overload_name if op._schema.overload_name else "")


def _has_kernel(op: torch._ops.OpOverload, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified(op), key)


def known_to_dispatcher(op: torch._ops.OpOverload) -> bool:
    """Whether torch's dispatcher has `op` now. torch.ops also lists TorchScript-only overloads
    the dispatcher never routes tensors through (aten::add(Scalar, Scalar), aten.add.default),
    and a torch.library operator defined after its handler was registered is not there yet."""
    try:
        torch._C._dispatch_find_schema_or_throw(op._schema.name, op._schema.overload_name)
    except RuntimeError:
        return False
    return True


def dispatch_keys_for(op: torch._ops.OpOverload, what: str) -> list[str]:
    """The keys a handler kernel for `op` goes on, or a ValueError where none reaches it."""
    if _has_kernel(op, "AutogradPrivateUse1"):
        return ["AutogradPrivateUse1", "PrivateUse1"]  # our own kernel above autograd (linear, dist)
    if _has_kernel(op, "CompositeImplicitAutograd"):
        raise ValueError(f"{what}: {qualified(op)} decomposes into other operators before ShardTensor dispatch sees it "
                         "(it is CompositeImplicitAutograd); register handlers for the operators it decomposes into, or a "
                         "function handler for the Python function that calls it")
    return ["PrivateUse1"]


def _check_outputs(op, out, mesh) -> None:
    """A dispatch handler's result: ShardTensors where the schema returns tensors, on `mesh`,
    with the global shapes the operator gives (where torch has a meta kernel for it)."""
    returns = [r for r in op._schema.returns]
    outs = out if isinstance(out, (tuple, list)) and len(returns) != 1 else (out,)
    if len(outs) != len(returns):
        raise TypeError(f"handler for {qualified(op)} returned {len(outs)} values; the operator returns {len(returns)}")
    for i, (value, ret) in enumerate(zip(outs, returns)):
        if not isinstance(ret.type, torch.TensorType):
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"handler for {qualified(op)} returned {type(value).__name__} as output {i}; "
                            "the operator returns a tensor there")
        if not _C.is_shard_tensor(value):
            raise TypeError(f"handler for {qualified(op)} returned a plain torch.Tensor as output {i} (shape "
                            f"{tuple(value.shape)}); on ShardTensor inputs a handler returns ShardTensors: wrap the local "
                            "result with ShardTensor.from_local(local, mesh, placements)")
        if mesh is not None and _C.mesh(value) != mesh:
            raise ValueError(f"handler for {qualified(op)} returned output {i} on another mesh than its inputs'")


def _expected_shapes(op, args, kwargs):
    """The global output shapes the operator computes, from meta tensors; None where torch has
    no meta kernel for it."""
    def meta(value):
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        if isinstance(value, (list, tuple)):
            return type(value)(meta(v) for v in value)
        return value

    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = op(*[meta(a) for a in args], **{k: meta(v) for k, v in kwargs.items()})
    except Exception:  # no meta kernel (custom ops, data-dependent shapes): nothing to compare
        return None
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [tuple(o.shape) if isinstance(o, torch.Tensor) else None for o in outs]


def _first_mesh(args, kwargs):
    for value in (*args, *kwargs.values()):
        for item in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(item, torch.Tensor) and _C.is_shard_tensor(item):
                return _C.mesh(item)
    return None


def _dispatch_kernel(op, registry, key: str):
    name = qualified(op)
    # Below autograd nothing records a graph (the operator's own derivative does): the handler
    # runs without grad mode, as libtorch's kernels do. Above it (AutogradPrivateUse1) it is
    # differentiated through what it calls.
    below_autograd = not key.startswith("Autograd")

    def kernel(*args, **kwargs):
        handler = registry[op]
        if below_autograd:
            with torch.no_grad():
                out = handler(*args, **kwargs)
        else:
            out = handler(*args, **kwargs)
        mesh = _first_mesh(args, kwargs)
        if mesh is not None:
            _check_outputs(op, out, mesh)
            expected = _expected_shapes(op, args, kwargs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for i, (value, shape) in enumerate(zip(outs, expected or ())):
                if shape is not None and isinstance(value, torch.Tensor) and tuple(value.shape) != shape:
                    raise ValueError(f"handler for {name} returned output {i} with global shape {tuple(value.shape)} "
                                     f"(placements {value.placements}); the operator's output has shape {shape}")
        return out

    kernel.__name__ = f"shardtensor_handler[{name}]"
    return kernel


def _library_for(op, kernels: dict):
    """A torch.library registration of `kernels` ({dispatch key: kernel}) for `op`; destroying it
    restores the kernels that ran before."""
    namespace, name = op._schema.name.split("::")
    lib = torch.library.Library(namespace, "IMPL")
    with warnings.catch_warnings():
        # Replacing shardtensor's own kernel for the key is the point; torch warns about it.
        warnings.simplefilter("ignore")
        for key, kernel in kernels.items():
            lib.impl(name + ("." + op._schema.overload_name if op._schema.overload_name else ""), kernel, key)
    return lib


def _named_op_kernel(op, registry, name):
    def kernel(*args, **kwargs):
        return registry[name](op, _SHARD_TYPES, args, kwargs)

    return kernel


# ---- Python functions -------------------------------------------------------------------------

def _homes_of(func) -> list[tuple[object, str]]:
    """Every (namespace, attribute) in torch's Python namespaces that holds `func`."""
    homes = []
    for module_name in _FUNCTION_HOMES:
        module = importlib.import_module(module_name)
        homes += [(module, name) for name, value in vars(module).items() if value is func]
    homes += [(torch.Tensor, name) for name, value in vars(torch.Tensor).items() if value is func]
    module_name = getattr(func, "__module__", None)
    name = getattr(func, "__name__", None)
    if module_name and name and not any(h[1] == name for h in homes):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
        if module is not None and getattr(module, name, None) is func:
            homes.append((module, name))
    return homes


def _resolve_path(path: str, what: str) -> tuple[object, str]:
    """("torch.nn.functional", "gelu") style: the object holding the last name, and the name."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:-1]:
            owner = getattr(owner, attr, None)
            if owner is None:
                break
        if owner is not None and hasattr(owner, parts[-1]):
            return owner, parts[-1]
    raise ValueError(f"{what}: {path!r} is neither an operator registered with torch.library ('namespace.name.overload') "
                     "nor an importable Python function ('torch.nn.functional.gelu')")


def _patched(original, lookup):
    def patched(*args, **kwargs):
        handler = lookup()
        if handler is not None and patches["enabled"] and _has_shard_tensor(args, kwargs):
            return handler(original, _SHARD_TYPES, args, kwargs)
        return original(*args, **kwargs)

    patched.__wrapped__ = original
    patched._shardtensor_original = original
    patched.__name__ = getattr(original, "__name__", "patched")
    patched.__doc__ = getattr(original, "__doc__", None)
    return patched


# ---- the registries ---------------------------------------------------------------------------

class _Registry(dict):
    """A dict whose entries are installed while present. Subclasses say how."""

    what = "register"

    def __init__(self):
        super().__init__()
        self._installed: dict = {}

    def _check(self, key, handler):
        return key, _callable(handler, self.what)

    def __setitem__(self, key, handler):
        key, handler = self._check(key, handler)
        # A second handler for a key replaces the first (a dict's, and PhysicsNeMo's, semantics):
        # what is installed already looks the handler up on every call.
        if self._installed.get(key) is None:
            self._installed[key] = self._install(key)
        super().__setitem__(key, handler)
        _install_pending()

    def __delitem__(self, key):
        super().__delitem__(key)
        installed = self._installed.pop(key)
        if installed:
            self._uninstall(key, installed)

    def install_pending(self) -> None:
        """Installs the entries stored before torch's dispatcher knew their operators."""
        for key in [k for k, installed in self._installed.items() if installed is None]:
            try:
                self._installed[key] = self._install(key)
            except ValueError as e:  # defined since as an operator no handler can reach
                warnings.warn(f"{e}; its stored handler stays inactive")
                self._installed[key] = ()

    def pop(self, key, *default):
        if key in self:
            value = self[key]
            del self[key]
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self):
        key = next(reversed(self))
        return key, self.pop(key)

    def clear(self):
        for key in list(self):
            del self[key]

    def update(self, *others, **kwargs):
        for key, handler in dict(*others, **kwargs).items():
            self[key] = handler

    def setdefault(self, key, handler=None):
        if key not in self:
            self[key] = handler
        return self[key]

    def replace_with(self, entries) -> None:
        """The contents of `entries` exactly (assigning a saved copy back restores it)."""
        entries = dict(entries)
        for key in [k for k in self if k not in entries]:
            del self[key]
        self.update(entries)

    def __copy__(self):
        return dict(self)

    def copy(self):
        return dict(self)


class DispatchRegistry(_Registry):
    what = "register_dispatch_handler"

    def _check(self, key, handler):
        op = resolve_operator(key, self.what)
        if known_to_dispatcher(op):
            dispatch_keys_for(op, self.what)
        return op, _callable(handler, self.what)

    def _install(self, op):
        """The kernels' registration; None (stored, installed at a later registration) while
        the dispatcher does not know `op`, as PhysicsNeMo's registry keeps any OpOverload."""
        if not known_to_dispatcher(op):
            return None
        return _library_for(op, {key: _dispatch_kernel(op, self, key) for key in dispatch_keys_for(op, self.what)})

    def _uninstall(self, op, lib):
        lib._destroy()


class FunctionRegistry(_Registry):
    what = "register_function_handler"

    def _check(self, func, handler):
        if not callable(func):
            raise TypeError(f"{self.what}: expected a function or method, got {type(func).__name__}")
        func = getattr(func, "_shardtensor_original", func)  # the patched name of an earlier handler
        # Registered already: its names now hold the replacement, so look no further.
        if func not in self._installed and not _homes_of(func):
            raise ValueError(f"{self.what}: found no name for {func!r} in {', '.join(_FUNCTION_HOMES)}, torch.Tensor or its "
                             "module; register it by its path: register_named_function_handler('package.module.name', h)")
        return func, _callable(handler, self.what)

    def _install(self, func):
        replaced = []
        replacement = _patched(func, lambda: self.get(func))
        for owner, name in _homes_of(func):
            replaced.append((owner, name, func))
            setattr(owner, name, replacement)
        return replaced

    def _uninstall(self, func, replaced):
        for owner, name, original in replaced:
            setattr(owner, name, original)


class NamedFunctionRegistry(_Registry):
    what = "register_named_function_handler"

    def _check(self, name, handler):
        if not isinstance(name, str):
            raise TypeError(f"{self.what}: expected a name (str), got {type(name).__name__}")
        _callable(handler, self.what)
        if self._operator(name) is None:
            _resolve_path(name, self.what)
        return name, handler

    def _operator(self, name):
        try:
            return resolve_operator(name, self.what)
        except ValueError:
            return None

    def _install(self, name):
        op = self._operator(name)
        if op is not None:
            # Above autograd, as PhysicsNeMo's __torch_function__ sees a custom op's call.
            kernel = _named_op_kernel(op, self, name)
            return ("op", _library_for(op, {"AutogradPrivateUse1": kernel, "PrivateUse1": kernel}))
        owner, attr = _resolve_path(name, self.what)
        original = getattr(owner, attr)
        setattr(owner, attr, _patched(original, lambda: self.get(name)))
        return ("patch", (owner, attr, original))

    def _uninstall(self, name, installed):
        kind, value = installed
        if kind == "op":
            value._destroy()
        else:
            owner, attr, original = value
            setattr(owner, attr, original)


def _install_pending() -> None:
    """Any registration installs the dispatch handlers whose operators the dispatcher has come to
    know since (a torch.library op defined after its handler)."""
    REGISTRIES["_dispatch_registry"].install_pending()


REGISTRIES = {
    "_dispatch_registry": DispatchRegistry(),
    "_function_registry": FunctionRegistry(),
    "_named_function_registry": NamedFunctionRegistry(),
}
