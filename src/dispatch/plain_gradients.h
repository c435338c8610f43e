// Plain tensors beside ShardTensors keep plain gradients (PhysicsNeMo's recipe: plain weights,
// sharded activations).
#pragma once

#include <ATen/core/Tensor.h>

namespace shardtensor {

// Teaches the library the C++ class of a Python autograd Function's node (torch's PyNode, in
// libtorch_python, which this library does not link), from `made_by_a_python_function`, a tensor
// whose grad_fn is one. torch.compile's regions (AOTAutograd's CompiledFunction) are such nodes;
// the Python package calls this when dynamo loads. Until then (a C++ program) no node is one.
void learn_python_function_node(const at::Tensor& made_by_a_python_function);

// `plain` (which requires grad) met ShardTensors in an operator and counted as Replicate, so
// autograd will hand it a ShardTensor gradient, usually a Partial sum of the ranks'
// contributions. Optimizers, clipping, torch's DDP and FSDP expect a plain parameter to have a
// plain gradient equal to one process's. This gives each autograd leaf behind `plain` (itself,
// or the leaves its graph reaches, as a weight's w.t() reaches w) a hook, once, that turns the
// gradient autograd has already summed over every use of the leaf into its full value: at most
// one reduction per leaf per backward however many operators used it, issued as soon as the
// leaf's gradient is ready, over only the mesh dims the gradient is partial or sharded on.
// Any tensor may be passed: ShardTensors, tensors that do not require grad and calls with grad
// mode off return at once.
void keep_gradient_plain(const at::Tensor& plain);

}  // namespace shardtensor
