"""DTensor's tensor-parallel module API (torch.distributed.tensor.parallel) over ShardTensors,
where a mesh that does not divide a size gives uneven pieces instead of an error:

    from shardtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    model = parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
"""

from .._distribute_module import distribute_module
from .api import parallelize_module
from .ddp import sum_gradients_with_ddp
from .loss import loss_parallel
from .style import (ColwiseParallel, ParallelStyle, PrepareModuleInput, PrepareModuleInputOutput, PrepareModuleOutput,
                    RowwiseParallel, SequenceParallel)

__all__ = ["ColwiseParallel", "ParallelStyle", "PrepareModuleInput", "PrepareModuleInputOutput", "PrepareModuleOutput",
           "RowwiseParallel", "SequenceParallel", "distribute_module", "loss_parallel", "parallelize_module",
           "sum_gradients_with_ddp"]
