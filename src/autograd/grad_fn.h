// Attaching a backward function to the outputs of shardtensor's conversions (from_local,
// to_local, redistribute, full_tensor). Uses libtorch's Node directly rather than
// torch::autograd::Function, because a Function can keep only IValues and our backward needs
// specs and meshes.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace shardtensor {

using BackwardFn = std::function<at::Tensor(const at::Tensor& grad_output)>;

// When grad mode is on and `input` requires grad, makes `output` a non-leaf whose gradient
// flows to `input` through `backward`. Returns `output` either way. `name` shows in grad_fn.
at::Tensor attach_grad_fn(at::Tensor output, const at::Tensor& input, BackwardFn backward, const char* name);

}  // namespace shardtensor
