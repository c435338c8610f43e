"""Sharded data parallelism for ShardTensor and plain parameters, with FSDP2's API:

    mesh = st.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], plan)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])

torch's MixedPrecisionPolicy and OffloadPolicy are the policy types, as in
torch.distributed.fsdp.
"""

from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

from ._module import FSDPModule, UnshardHandle, fully_shard

__all__ = ["CPUOffloadPolicy", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "UnshardHandle", "fully_shard"]
