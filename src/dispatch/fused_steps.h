// torch's fused optimizer steps (_fused_adam_, _fused_adamw_, _fused_sgd_, _fused_adagrad_:
// torch.optim's fused=True) and GradScaler's unscale (_amp_foreach_non_finite_check_and_unscale_)
// on ShardTensors.
//
// A step is elementwise within each parameter: every element of the parameter, its gradient and
// its state is updated from the same position of each. So where a parameter's gradient and
// state lie as the parameter does (the optimizer makes its state with zeros_like, and a gradient
// takes its leaf's layout), the step on the local pieces is the step on the whole tensor: one
// call of torch's own fused kernel on every parameter's local piece, with no message, whatever
// mesh and placements each parameter has. A gradient laid out otherwise (a pending sum) is moved
// to its parameter's layout first; a state laid out otherwise, or on another mesh, is an error
// naming the parameter. Scalars (step counts, a tensor learning rate, grad_scale, found_inf)
// are one per process: plain, or Replicate ShardTensors.
//
// Unscaling finds non-finite gradients piece by piece; found_inf is then the maximum over every
// mesh the gradients live on, so that a step skipped on one rank is skipped on all of them.
// Both kernels are registered on PrivateUse1 and its autograd key (library.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace shardtensor {

// The operators fused_step_kernel serves, and GradScaler's unscale.
extern const char* const kFusedStepOps[8];
constexpr const char* kUnscaleOp = "_amp_foreach_non_finite_check_and_unscale_";

void fused_step_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void unscale_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace shardtensor
