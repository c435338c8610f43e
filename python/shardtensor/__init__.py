"""shardtensor: tensors that live across many processes, with DTensor's and PhysicsNeMo
ShardTensor's API for PyTorch programs and a C++ core underneath.

    import shardtensor as st
    mesh = st.init_device_mesh("cpu", (4,))
    x = st.distribute_tensor(torch.randn(10, 6), mesh, [st.Shard(0)])   # rows 3, 3, 3, 1
    y = (x * 2).relu().sum(0)            # dispatched in C++: no Python runs per operator
    y.placements, y.full_tensor()

A ShardTensor is a plain torch.Tensor whose sizes are the global sizes; isinstance(x,
st.ShardTensor) tells them apart. torch.nn modules, autograd and torch.optim work on them.
"""

import atexit

import torch  # loads libtorch before the extension that links it

from . import _C, _compile, _data_parallel_guards, _dtensor_operands, _logging, _mesh, _torch_checkpoint
from ._placements import NormPartial, Partial, Placement, Replicate, Shard, ZigzagShard
from ._mesh import DeviceMesh, init_device_mesh
from ._tensor import (
    ShardTensor,
    describe,
    distribute_tensor,
    from_dtensor,
    from_local,
    install_tensor_methods,
    is_shard_tensor,
    scatter_tensor,
    to_dtensor,
)
from ._factories import empty, full, manual_seed, ones, rand, randn, zeros
from ._register_sharding import register_sharding
from .context_parallel import context_parallel, context_parallel_unshard, zigzag_shard, zigzag_shard_sizes, zigzag_unshard
from ._debug import (
    CommDebugMode,
    explain_redistribute,
    fallback_operators,
    implicit_replication,
    is_implicit_replication,
    is_strict,
    layout_table,
    local_map,
    propagated_operators,
    set_implicit_replication,
    set_strict,
    strict,
    transport_options,
    visualize_sharding,
)
from ._distribute_module import distribute_module
from . import parallel  # noqa: F401  (st.parallel without importing it)
from ._sync import sync_module_over_mesh


install_tensor_methods()
_torch_checkpoint.install()  # torch.distributed.checkpoint and torch's state-dict utilities take ShardTensors
_data_parallel_guards.install()  # torch's fully_shard and DDP on ShardTensor parameters raise at once
_dtensor_operands.install()  # an operator meeting DTensors beside ShardTensors runs on ShardTensors
_compile.install()  # torch.compile leaves ShardTensors to eager mode (graph breaks): see _compile


# Caches, meshes and tensors hold c10d backends; at exit they are released while the
# interpreter and c10d still run (_mesh.shutdown).
_logging.install()  # the C++ log through logging.getLogger("shardtensor") (TORCH_LOGS=+shardtensor)
atexit.register(_logging.uninstall)  # runs after shutdown (atexit runs last-in first-out)
atexit.register(_mesh.shutdown)

built_with_nccl = _C.built_with_nccl
__version__ = "0.1.0"

__all__ = [
    "CommDebugMode", "DeviceMesh", "NormPartial", "Partial", "Placement", "Replicate", "Shard", "ShardTensor", "ZigzagShard",
    "built_with_nccl", "context_parallel", "context_parallel_unshard", "describe", "distribute_module", "distribute_tensor", "empty",
    "explain_redistribute", "fallback_operators",
    "from_dtensor", "from_local", "full", "implicit_replication", "init_device_mesh", "is_implicit_replication", "is_shard_tensor",
    "is_strict", "layout_table", "local_map", "manual_seed", "ones", "propagated_operators", "rand", "randn", "register_sharding",
    "scatter_tensor", "set_implicit_replication", "set_strict", "sync_module_over_mesh", "strict", "to_dtensor", "transport_options", "visualize_sharding", "zeros",
    "zigzag_shard", "zigzag_shard_sizes", "zigzag_unshard",
]
