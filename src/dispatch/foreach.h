// The _foreach_* operators on ShardTensors, as one call of the per-tensor operator per element.
//
// torch.optim (foreach=True, the default for native tensors on CUDA) and
// torch.nn.utils.clip_grad_norm_ call them on lists of parameters and gradients. Each element
// may have its own mesh and placements, so a list-wide rule would have to agree on all of
// them; per element, every call goes through the per-tensor operator's own sharding rule and
// autograd formula. The kernel is registered on PrivateUse1 and its autograd key
// (library.cpp) for every aten::_foreach_* operator.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace shardtensor {

void foreach_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace shardtensor
