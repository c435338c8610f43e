// The boxed kernel every ATen operator on a ShardTensor reaches (see library.cpp).
#pragma once

#include <ATen/core/stack.h>

#include <string>

namespace c10 {
class OperatorHandle;
}

namespace shardtensor {

// unwrap -> rule -> (inputs already in the needed layout) -> run on local tensors with
// autograd excluded -> wrap outputs. Operators without a rule raise an error naming them.
void shard_tensor_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

struct Propagation;

// The boxed kernel after its lookup: the call on `stack` whose propagation is `p` (the direct
// kernels' other path, which has looked it up already). Autograd keys must be excluded.
void run_propagated(const c10::OperatorHandle& op, torch::jit::Stack* stack, Propagation& p);

// The direct path's step for every ShardTensor input before its local piece is used, as the
// boxed kernel's: a trained leaf gets its gradient kept in its own layout.
void keep_leaf_layout_of_input(const at::Tensor& input);

// The direct path where the rule has a kernel that moves nothing: that kernel on a stack of
// the local pieces and the other arguments; the result wrapped.
at::Tensor run_rule_kernel_direct(const c10::OperatorHandle& op, Propagation& p, c10::ArrayRef<c10::IValue> args);

// The direct path's result: `local` wrapped exactly as the boxed kernel wraps its one output.
// `args` (boxed) are read only where the op permutes dims (Propagation::permutes_dims).
at::Tensor wrap_direct_output(Propagation& p, c10::ArrayRef<c10::IValue> args, const at::Tensor& local);


}  // namespace shardtensor
