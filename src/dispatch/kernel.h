// The boxed kernel every ATen operator on a ShardTensor reaches (see library.cpp).
#pragma once

#include <ATen/core/stack.h>

namespace c10 {
class OperatorHandle;
}

namespace shardtensor {

// unwrap -> rule -> (inputs already in the needed layout) -> run on local tensors with
// autograd excluded -> wrap outputs. Operators without a rule raise an error naming them.
void shard_tensor_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace shardtensor
