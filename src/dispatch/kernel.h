// The boxed kernel every ATen operator on a ShardTensor reaches (see library.cpp).
#pragma once

#include <ATen/core/stack.h>

#include <string>

namespace c10 {
class OperatorHandle;
struct OperatorName;
}

namespace shardtensor {

// unwrap -> rule -> (inputs already in the needed layout) -> run on local tensors with
// autograd excluded -> wrap outputs. Operators without a rule raise an error naming them.
void shard_tensor_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// "aten::add.Tensor": the name rules are registered under.
std::string full_op_name(const c10::OperatorName& name);

}  // namespace shardtensor
