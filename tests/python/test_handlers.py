"""PhysicsNeMo's handler registries and DTensor's register_sharding, at world sizes 1-4 on uneven
splits with empty pieces, against one process; bad input raises the same error on every rank.
(Ranks run with SHARDTENSOR_STRICT=1: an operator that would fall back raises.)"""

import os
import sys

import pytest
import torch
import torch.nn.functional as F

from oracle import assert_close, chunk_sizes
from ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4]
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def _sizes(length, world_size):
    """An uneven split with an empty piece where there is room for one."""
    return [0] + chunk_sizes(length, world_size - 1) if world_size > 1 else [length]


# ---- PhysicsNeMo's own registration test, restated with only the import changed ------------

torch_function_paths = []
torch_dispatch_paths = []


def physicsnemo_body(rank, world_size):
    import shardtensor as st
    from shardtensor import Replicate, ShardTensor  # PhysicsNeMo: physicsnemo.domain_parallel / torch placements

    def mul_wrapper(func, types, args, kwargs):
        torch_function_paths.append("mul_wrapper")
        if isinstance(args[0], ShardTensor) and isinstance(args[1], ShardTensor):
            local_result = args[0]._local_tensor * args[1]._local_tensor
            return ShardTensor.from_local(local_result, args[0]._spec.mesh, args[0]._spec.placements)
        return func(*args, **kwargs)

    def add_wrapper(a, b, alpha=1):
        torch_dispatch_paths.append("add_wrapper")
        if isinstance(a, ShardTensor) and isinstance(b, ShardTensor):
            local_result = a._local_tensor + alpha * b._local_tensor
            return ShardTensor.from_local(local_result, a._spec.mesh, a._spec.placements)
        return torch.ops.aten.add.Tensor(a, b, alpha)

    device_mesh = st.init_device_mesh("cpu", (world_size,))
    original_dispatch_registry = ShardTensor._dispatch_registry.copy()
    original_function_registry = ShardTensor._function_registry.copy()
    ShardTensor.register_function_handler(torch.mul, mul_wrapper)
    ShardTensor.register_dispatch_handler(torch.ops.aten.add.Tensor, add_wrapper)
    ShardTensor._enable_shard_patches = True
    assert ShardTensor.patches_enabled()
    try:
        # Plain tensors never reach a handler.
        assert torch.all(torch.mul(torch.ones(2, 3), torch.ones(2, 3) * 2) == 2)
        assert torch.all(torch.ones(2, 3) + torch.ones(2, 3) * 2 == 3)
        assert torch_function_paths == [] and torch_dispatch_paths == []

        a = ShardTensor.from_local(torch.ones(2, 3), device_mesh, [Replicate()])
        b = ShardTensor.from_local(torch.ones(2, 3) * 2, device_mesh, [Replicate()])
        result = torch.mul(a, b)
        assert isinstance(result, ShardTensor) and torch.all(result.to_local() == 2)
        assert torch_function_paths == ["mul_wrapper"] and torch_dispatch_paths == []

        result = a + b
        assert isinstance(result, ShardTensor) and torch.all(result.to_local() == 3)
        assert torch_dispatch_paths == ["add_wrapper"] and torch_function_paths == ["mul_wrapper"]
    finally:
        ShardTensor._dispatch_registry = original_dispatch_registry
        ShardTensor._function_registry = original_function_registry

    # Restored: the built-in rule and the original function run again.
    torch_dispatch_paths.clear()
    torch_function_paths.clear()
    assert not hasattr(torch.mul, "_shardtensor_original")
    result = a + b
    assert torch.all(result.to_local() == 3) and torch_dispatch_paths == []
    result = torch.mul(a, b)
    assert torch.all(result.to_local() == 2) and torch_function_paths == []
    assert dict(ShardTensor._dispatch_registry) == {} and dict(ShardTensor._function_registry) == {}



# ---- a dispatch handler: below autograd, gradients from the operator's own formula ------------

def dispatch_handler_body(rank, world_size):
    import shardtensor as st
    from shardtensor import ShardTensor

    calls = []

    def mul_on_pieces(a, b):
        calls.append(tuple(a.shape))
        b = b.redistribute(a.device_mesh, a.placements, sharding_shapes=a.shard_sizes())
        return ShardTensor.from_local(a._local_tensor * b._local_tensor, a.device_mesh, a.placements,
                                      sharding_shapes=a.shard_sizes())

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    g, w = torch.randn(9, 4, dtype=torch.float64), torch.randn(9, 4, dtype=torch.float64)
    sizes = _sizes(9, world_size)
    x = st.distribute_tensor(g, mesh, [st.Shard(0)], sharding_shapes={0: sizes}).requires_grad_()
    y = st.distribute_tensor(w, mesh, [st.Replicate()]).requires_grad_()
    ShardTensor.register_dispatch_handler(torch.ops.aten.mul.Tensor, mul_on_pieces)
    try:
        out = x * y
        (out * out).sum().backward()   # mul's backward calls mul again: the handler each time
    finally:
        del ShardTensor._dispatch_registry[torch.ops.aten.mul.Tensor]
    assert len(calls) >= 3, calls
    gx, gw = g.clone().requires_grad_(), w.clone().requires_grad_()
    ((gx * gw) ** 2).sum().backward()
    assert out.placements == (st.Shard(0),) and out.shard_sizes() == {0: sizes}
    assert_close(out.full_tensor(), g * w, "handler's values", rtol=1e-12, atol=1e-12)
    assert_close(x.grad.full_tensor(), gx.grad, "gradient through the operator's formula", rtol=1e-12, atol=1e-12)
    assert_close(y.grad.full_tensor(), gw.grad, "replicated operand's gradient", rtol=1e-12, atol=1e-12)
    # Removed: the C++ rule runs again, no Python.
    calls.clear()
    assert_close((x * y).full_tensor(), g * w, "after removal")
    assert calls == []



# ---- function handlers: above autograd, differentiable ops or an autograd.Function ----------

def function_handler_body(rank, world_size):
    import shardtensor as st
    from shardtensor import ShardTensor

    class LocalSoftsign(torch.autograd.Function):
        """softsign on the local piece with a backward of its own (counted)."""
        backward_calls = 0

        @staticmethod
        def forward(ctx, local):
            ctx.save_for_backward(local)
            return local / (1 + local.abs())

        @staticmethod
        def backward(ctx, grad):
            LocalSoftsign.backward_calls += 1
            (local,) = ctx.saved_tensors
            return grad / (1 + local.abs()) ** 2

    def softsign_handler(func, types, args, kwargs):
        (x,) = args
        assert func is F.softsign.__wrapped__ and types == (ShardTensor,)
        return ShardTensor.from_local(LocalSoftsign.apply(x.to_local()), x.device_mesh, x.placements,
                                      sharding_shapes=x.shard_sizes())

    def gelu_handler(func, types, args, kwargs):
        x = args[0]
        return 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))   # differentiable ops on the ShardTensor itself

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(1)
    g = torch.randn(7, 5, dtype=torch.float64)
    sizes = _sizes(7, world_size)
    x = st.distribute_tensor(g, mesh, [st.Shard(0)], sharding_shapes={0: sizes}).requires_grad_()
    ShardTensor.register_function_handler(F.softsign, softsign_handler)
    ShardTensor.register_named_function_handler("torch.nn.functional.gelu", gelu_handler)
    try:
        assert F.softsign.__wrapped__ is not None
        out = F.softsign(x) + F.gelu(x)
        (out * out).sum().backward()
        plain = F.softsign(g)                      # plain tensors: the original function
        assert_close(plain, g / (1 + g.abs()), "plain softsign untouched")
    finally:
        ShardTensor._function_registry.clear()
        ShardTensor._named_function_registry.clear()
    assert not hasattr(F.softsign, "_shardtensor_original") and not hasattr(F.gelu, "_shardtensor_original")
    gg = g.clone().requires_grad_()
    ref = F.softsign(gg) + F.gelu(gg)
    (ref * ref).sum().backward()
    assert LocalSoftsign.backward_calls == 1
    assert_close(out.full_tensor(), ref.detach(), "function handlers' values", rtol=1e-12, atol=1e-12)
    assert_close(x.grad.full_tensor(), gg.grad, "function handlers' gradients", rtol=1e-12, atol=1e-12)

    # patches_enabled: off, the original runs on ShardTensors too (gelu has a rule).
    ShardTensor.register_named_function_handler("torch.nn.functional.gelu", lambda *a: 1 / 0)
    ShardTensor._enable_shard_patches = False
    try:
        assert not ShardTensor.patches_enabled()
        assert_close(F.gelu(x).full_tensor(), F.gelu(g), "patches off")
    finally:
        ShardTensor._enable_shard_patches = True
        ShardTensor._named_function_registry.clear()



# ---- strict mode: a handler is not a fallback ------------------------------------------------

def strict_body(rank, world_size):
    import shardtensor as st
    from shardtensor import ShardTensor

    mesh = st.init_device_mesh("cpu", (world_size,))
    g = torch.arange(10.0).reshape(5, 2)
    x = st.distribute_tensor(g, mesh, [st.Shard(0)], sharding_shapes={0: _sizes(5, world_size)})
    op = torch.ops.aten.diag_embed.default
    assert st.is_strict()
    with pytest.raises(NotImplementedError, match="diag_embed"):
        op(x)                                           # no rule (test_operator_coverage.py): strict mode refuses to gather

    def diag_embed_on_pieces(t):
        return ShardTensor.from_local(op(t._local_tensor), t.device_mesh, t.placements, sharding_shapes=t.shard_sizes())

    ShardTensor.register_dispatch_handler("aten::diag_embed", diag_embed_on_pieces)
    try:
        assert_close(op(x).full_tensor(), op(g), "handler in strict mode")
    finally:
        ShardTensor._dispatch_registry.clear()
    with pytest.raises(NotImplementedError, match="diag_embed"):
        op(x)



# ---- a custom operator's named handler --------------------------------------------------------

def custom_op_body(rank, world_size):
    import shardtensor as st
    from shardtensor import ShardTensor

    @torch.library.custom_op("shardtensor_test::scale_rows", mutates_args=())
    def scale_rows(x: torch.Tensor, factor: float) -> torch.Tensor:
        return x * factor

    def scale_on_shards(func, types, args, kwargs):
        x, factor = args
        return x * factor          # above autograd: differentiated through the ShardTensor ops

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(3)
    g = torch.randn(6, 3, dtype=torch.float64)
    x = st.distribute_tensor(g, mesh, [st.Shard(0)], sharding_shapes={0: _sizes(6, world_size)}).requires_grad_()
    ShardTensor.register_named_function_handler("shardtensor_test.scale_rows.default", scale_on_shards)
    try:
        out = scale_rows(x, 3.0)
        out.sum().backward()
    finally:
        ShardTensor._named_function_registry.clear()
    assert out.placements == (st.Shard(0),)
    assert_close(out.full_tensor(), g * 3, "custom op through its handler")
    assert_close(x.grad.full_tensor(), torch.full_like(g, 3.0), "its gradient")



# ---- bad input: the same clear error on every rank --------------------------------------------

def bad_input_body(rank, world_size):
    import shardtensor as st
    from shardtensor import ShardTensor

    mesh = st.init_device_mesh("cpu", (world_size,))
    x = st.distribute_tensor(torch.arange(8.0), mesh, [st.Shard(0)])
    with pytest.raises(ValueError, match="no operator 'aten::no_such_op'"):
        ShardTensor.register_dispatch_handler("aten::no_such_op", lambda *a: None)
    with pytest.raises(ValueError, match="several overloads"):
        ShardTensor.register_dispatch_handler(torch.ops.aten.add, lambda *a: None)
    with pytest.raises(ValueError, match="CompositeImplicitAutograd"):
        ShardTensor.register_dispatch_handler(torch.ops.aten.matmul.default, lambda *a: None)
    with pytest.raises(TypeError, match="callable"):
        ShardTensor.register_dispatch_handler(torch.ops.aten.neg.default, "not a function")
    with pytest.raises(ValueError, match="neither an operator"):
        ShardTensor.register_named_function_handler("no.such.module.function", lambda *a: None)
    assert dict(ShardTensor._dispatch_registry) == {} and dict(ShardTensor._named_function_registry) == {}

    # A handler returning a plain tensor, or the wrong global shape: an error, not a wrong value.
    ShardTensor.register_dispatch_handler(torch.ops.aten.neg.default, lambda t: -t._local_tensor)
    try:
        with pytest.raises(TypeError, match="returned a plain torch.Tensor"):
            -x
        ShardTensor._dispatch_registry[torch.ops.aten.neg.default] = lambda t: ShardTensor.from_local(
            -t._local_tensor, mesh, [st.Replicate()])
        if world_size > 1:
            with pytest.raises(ValueError, match="global shape"):
                -x
    finally:
        ShardTensor._dispatch_registry.clear()
    assert_close((-x).full_tensor(), -torch.arange(8.0), "the rule again")



# ---- the example: neighbourhood attention over a split sequence ------------------------------

def example_body(rank, world_size):
    sys.path.insert(0, EXAMPLES)
    import neighbourhood_attention_handler as example

    example.main()



# ---- register_sharding ---------------------------------------------------------------------------

def register_sharding_body(rank, world_size):
    import shardtensor as st
    from shardtensor import Replicate, Shard, register_sharding

    aten = torch.ops.aten
    seen = []

    # DTensor's documented example, only the import changed.
    @register_sharding(aten._softmax.default)
    def custom_softmax_sharding(x, dim, half_to_float):
        seen.append((tuple(x.shape), x.placements, dim))
        softmax_dim = dim if dim >= 0 else dim + x.ndim
        acceptable_shardings = []
        all_replicate = ([Replicate()], [Replicate(), None, None])
        acceptable_shardings.append(all_replicate)
        for sharding_dim in range(x.ndim):
            if sharding_dim != softmax_dim:
                all_sharded = ([Shard(sharding_dim)], [Shard(sharding_dim), None, None])
                acceptable_shardings.append(all_sharded)
        return acceptable_shardings

    shape = (2, world_size // 2) if world_size == 4 else (world_size,)
    mesh = st.init_device_mesh("cpu", shape)
    torch.manual_seed(2)
    g = torch.randn(7, 6, dtype=torch.float64)
    x = st.distribute_tensor(g, mesh, [Shard(0)] * len(shape)).requires_grad_()
    with st.CommDebugMode() as comms:
        y = torch.softmax(x, dim=1)
        y2 = torch.softmax(x, dim=1)
    assert comms.get_total_counts() == 0, comms.get_comm_counts()  # rows split, softmax along columns: no move
    assert len(seen) == 1, seen                                    # the second call hit the cache
    assert y.placements == x.placements and y2.shard_sizes() == x.shard_sizes()
    assert_close(y.full_tensor(), torch.softmax(g, 1), "register_sharding softmax")
    # Along the split dim: the cheapest acceptable sharding is to replicate... or reshard dim 1.
    z = torch.softmax(x, dim=0)
    assert all(not p.is_shard(0) for p in z.placements), z.placements
    assert_close(z.full_tensor(), torch.softmax(g, 0), "softmax along the split dim")
    z.sum().backward()
    assert_close(x.grad.full_tensor(), torch.zeros_like(g), "softmax rows sum to one: zero gradient", atol=1e-12)

    # Errors in the function: on every rank, naming the operator.
    @register_sharding(aten.sinh.default)
    def wrong(x):
        return [([Shard(0)], [Shard(0), Replicate()])]   # two inputs for a one-input op

    with pytest.raises(ValueError, match="aten::sinh"):
        torch.sinh(x)
    with pytest.raises(ValueError, match="CompositeImplicitAutograd"):
        register_sharding(aten.matmul.default)


# One launch per world size runs every body in turn (each cleans up the handlers it registered;
# register_sharding's, which replace rules for good, come last): spawning ranks is most of a
# multi-rank test's time on CI's two cores.
def all_bodies(rank, world_size):
    for body in (physicsnemo_body, dispatch_handler_body, function_handler_body, strict_body, custom_op_body,
                 bad_input_body, example_body, register_sharding_body):
        body(rank, world_size)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_handlers_and_register_sharding(world_size):
    run_ranks(all_bodies, world_size, timeout=600)
