"""torch.compile on models that hold or take ShardTensors: a tensor-parallel MLP, torchtitan's
llama block plan, the demo's U-Net on an H split and a transformer block on a sequence split
(ring attention), each under the eager, aot_eager and inductor backends, on sizes the mesh does
not divide. Values and gradients are compared with the same model on one process. With
SHARDTENSOR_COMPILE=eager, the opt-out from tracing (test_compile_traced.py tests the default),
operators on ShardTensors run eagerly behind graph breaks; plain work beside them is compiled, and its gradients, which arrive as ShardTensors, are right under Inductor's
generated kernels too. fullgraph=True refuses with dynamo's error naming ShardTensor."""

import copy
from functools import partial
import warnings

import pytest
import torch
import torch.nn.functional as F

from compile_models import TOL, check_gradients, llama_block, tp_mlp, unet
from oracle import assert_close, chunk_sizes
from ranks import run_ranks

BACKENDS = ["eager", "aot_eager", "inductor"]
ENV = {"SHARDTENSOR_COMPILE": "eager"}  # ranks.py sets Inductor's compile threads


def _compiled(model, backend, dynamic=None):
    torch._dynamo.reset()  # each backend traces afresh
    return torch.compile(model, backend=backend, dynamic=dynamic)


def ring_attention(mesh, backend):
    import shardtensor as st
    from test_attention import Block
    from test_training import shard_parameters

    torch.manual_seed(0)
    single = Block(8, 2).double()
    model = shard_parameters(copy.deepcopy(single), mesh, lambda name, p: [st.Replicate()])
    compiled = _compiled(model, backend)
    seq = 4 * mesh.size() + 3
    x = torch.randn(2, seq, 8, dtype=torch.float64)
    with st.CommDebugMode() as comms:
        out = compiled(st.distribute_tensor(x, mesh, [st.Shard(1)]))
        out.sum().backward()
    expected = single(x)
    expected.sum().backward()
    assert_close(out.full_tensor(), expected.detach(), f"ring attention, {backend}: output", **TOL)
    check_gradients(model, single, f"ring attention, {backend}")
    counts = comms.get_comm_counts()
    assert (counts.get("ring_send_recv", 0) > 0) == (mesh.size() > 1), comms.table()


MODELS = {"tp_mlp": partial(tp_mlp, compile=_compiled), "llama": partial(llama_block, compile=_compiled),
          "unet": partial(unet, compile=_compiled), "ring_attention": ring_attention}


def models_body(rank, world_size, models):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in models:
            for backend in BACKENDS:
                MODELS[name](mesh, backend)
    said = [str(w.message) for w in caught if str(w.message).startswith("torch.compile: ShardTensors are not traced")]
    assert len(said) == 1 and "run eagerly" in said[0], f"expected one warning about compile, got {said}"
    assert st.fallback_operators() == [], st.fallback_operators()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_models_compile_on_every_backend_and_match_one_process(world_size):
    run_ranks(models_body, world_size, list(MODELS), timeout=600, env=ENV)


def _plain_around_sharded(x, w):
    scale = torch.tanh(w) * 3  # plain: compiled
    y = (x * 2).relu() @ scale  # sharded: eager
    return y.sum(0) + 1


def plain_work_body(rank, world_size):
    """Plain work before and after the sharded operators is compiled, and its gradient, which
    the sharded operators hand back as a ShardTensor (a Partial sum), reaches the plain weight
    in full: Inductor's kernels read data pointers, which a ShardTensor has none of."""
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    x, w = torch.randn(7, 5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    sx = st.distribute_tensor(x, mesh, [st.Shard(0)])
    reference_w = w.clone().requires_grad_()
    expected = _plain_around_sharded(x, reference_w)
    expected.sum().backward()
    for backend in BACKENDS:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(_plain_around_sharded)(sx, w)
        assert explained.graph_count >= 1 and explained.break_reasons, explained
        compiled = torch.compile(_plain_around_sharded, backend=backend)
        for call in range(2):
            pw = w.clone().requires_grad_()
            out = compiled(sx, pw)
            out.full_tensor().sum().backward()
            assert_close(out.full_tensor(), expected.detach(), f"{backend}, call {call}: value", **TOL)
            assert not st.is_shard_tensor(pw.grad), f"{backend}: the plain weight's gradient is a ShardTensor"
            assert_close(pw.grad, reference_w.grad, f"{backend}, call {call}: gradient of the plain weight", **TOL)


def _scaled_gelu(t):
    return F.gelu(t) * 2 + 1


def _through_local_map(x):
    import shardtensor as st

    y = st.local_map(_scaled_gelu, out_placements=[st.Shard(0)], in_placements=([st.Shard(0)],))(x)
    return y.sum(0)


def local_map_body(rank, world_size):
    """A compiled function that calls local_map: shardtensor's own code runs eagerly, and the
    function it maps over the pieces is compiled on each rank's plain piece (dynamo meets its
    frame on its own), values and gradients as eager."""
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    x = torch.randn(7, 5, dtype=torch.float64)
    reference = x.clone().requires_grad_()
    expected = _scaled_gelu(reference).sum(0)
    expected.sum().backward()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    for backend in (counting, "inductor"):
        torch._dynamo.reset()
        sx = st.distribute_tensor(x, mesh, [st.Shard(0)]).requires_grad_()
        out = torch.compile(_through_local_map, backend=backend)(sx)
        out.full_tensor().sum().backward()
        assert_close(out.full_tensor(), expected.detach(), f"{backend}: value", **TOL)
        assert_close(sx.grad.full_tensor(), reference.grad, f"{backend}: gradient", **TOL)
    assert any(any("gelu" in t for t in g) for g in graphs), f"no compiled graph holds the mapped gelu: {graphs}"


def test_local_map_bodies_compile_on_the_pieces():
    run_ranks(local_map_body, 3, env=ENV)


@pytest.mark.parametrize("world_size", [2, 3])
def test_plain_work_beside_sharded_work_compiles_with_right_gradients(world_size):
    run_ranks(plain_work_body, world_size, timeout=400, env=ENV)


def _split_sum(x):
    return (x * x).sum(0)


def layouts_body(rank, world_size):
    """The same global shape split two ways through one compiled function: each call gives its
    own layout's answer (no graph is built on a ShardTensor, so none can be reused for another
    layout); and fullgraph=True refuses with dynamo's error, which names ShardTensor and says how
    to trace it instead."""
    import shardtensor as st
    from torch._dynamo.exc import Unsupported

    mesh = st.init_device_mesh("cpu", (world_size,))
    x = torch.arange(10 * 3, dtype=torch.float64).view(10, 3)
    compiled = torch.compile(_split_sum, backend="inductor")
    for sizes in (chunk_sizes(10, world_size), list(reversed(chunk_sizes(10, world_size))), [10] + [0] * (world_size - 1)):
        sx = st.distribute_tensor(x, mesh, [st.Shard(0)], sharding_shapes={0: sizes})
        out = compiled(sx)
        assert out.placements == (st.Partial(),), out.placements
        assert_close(out.to_local(), _split_sum(x.narrow(0, sum(sizes[:rank]), sizes[rank])), f"split {sizes}: local sum", **TOL)
        assert_close(out.full_tensor(), _split_sum(x), f"split {sizes}: full sum", **TOL)
    torch._dynamo.reset()  # dynamo remembers that _split_sum's frame runs eagerly, and would not trace it again
    with pytest.raises(Unsupported, match="ShardTensor") as refused:
        torch.compile(_split_sum, backend="eager", fullgraph=True)(sx)
    assert "SHARDTENSOR_COMPILE unset" in str(refused.value), f"the error does not say how to trace: {refused.value}"


@pytest.mark.parametrize("world_size", [1, 4])
def test_a_compiled_function_follows_each_split_and_fullgraph_refuses_clearly(world_size):
    run_ranks(layouts_body, world_size, env=ENV)
