"""DTensor's experimental names, where its programs import them from
(torch.distributed.tensor.experimental): ``from shardtensor.experimental import context_parallel``."""

from .context_parallel import context_parallel, context_parallel_unshard

__all__ = ["context_parallel", "context_parallel_unshard"]
