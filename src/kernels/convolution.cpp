// Halo convolution: the kernels of ConvolutionPlan (rules/convolution.h; the rule file says
// how each layout is handled).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "domain/kernel_moves.h"
#include "kernels/stack.h"
#include "kernels/window_cache.h"
#include "rules/convolution.h"

namespace shardtensor {
namespace {

// Whether a sharded dim has no positions on this rank.
bool empty_here(const ConvolutionPlan& plan, const at::Tensor& t) {
  for (const HaloAxis& a : plan.halo.axes)
    if (t.size(a.tensor_dim) == 0) return true;
  return false;
}

// The shape of the local op's result on `input` (a window, or the local rows when
// transposed), for when there is nothing to compute: zeros of this shape stand in.
std::vector<int64_t> local_result_shape(const ConvolutionPlan& plan, const at::Tensor& input, int64_t channels) {
  const ConvParams& params = plan.params;
  std::vector<int64_t> shape = input.sizes().vec();
  shape[1] = channels;
  const int64_t first = input.dim() - params.spatial;
  for (int64_t i = 0; i < params.spatial; ++i) {
    const int64_t n = input.size(first + i), s = params.stride[i], e = params.extent(i);
    shape[first + i] = params.transposed ? (n - 1) * s - 2 * plan.local_padding[i] + e + plan.local_output_padding[i]
                                         : (n + 2 * plan.local_padding[i] - e) / s + 1;
  }
  for (size_t k = 0; k < plan.halo.axes.size(); ++k) {
    const HaloAxis& a = plan.halo.axes[k];
    const int64_t me = a.me(plan.halo.mesh);
    shape[a.tensor_dim] = params.transposed ? a.window[me].size() : plan.outputs[k][me].size();
  }
  return shape;
}

// Regular convolution on this rank's window.
LocalKernel regular_forward(const ConvolutionPlan& plan, const KernelMoves& moves) {
  return [plan = plan, moves = moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    OpArguments args(op, stack);
    const at::Tensor piece = args.tensor("input");
    const at::Tensor window = moves.gather_windows(piece);
    keep_received_rows(moves, piece, window);  // for convolution_backward
    const at::Tensor weight = args.tensor("weight");
    if (empty_here(plan, window)) {  // no outputs on this rank
      stack->push_back(at::zeros(local_result_shape(plan, window, weight.size(0)), window.options()));
      return;
    }
    args.set("input", window);
    args.set("padding", plan.local_padding);
    std::move(args).call(op, stack);
  };
}

// convolution_backward for a regular convolution: the input window again (from the rows the
// forward received, kernels/window_cache.h, or gathered again), then its gradient scattered back
// to the owners.
LocalKernel regular_backward(const ConvolutionPlan& plan, const KernelMoves& moves) {
  return [plan = plan, moves = moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    OpArguments args(op, stack);
    const at::Tensor grad = args.tensor("grad_output"), weight = args.tensor("weight");
    const at::Tensor piece = args.tensor("input");
    at::Tensor window = window_from_kept_rows(moves, piece);
    if (!window.defined()) window = moves.gather_windows(piece);
    const c10::List<bool> output_mask = args.bool_list("output_mask");
    const std::vector<bool> mask = {output_mask.get(0), output_mask.get(1), output_mask.get(2)};
    at::Tensor grad_window, grad_weight, grad_bias;
    if (grad.numel() == 0 || window.numel() == 0) {
      grad_window = at::zeros_like(window);
      grad_weight = at::zeros_like(weight);
      grad_bias = at::zeros({weight.size(0)}, weight.options());
    } else {
      args.set("input", window);
      args.set("padding", plan.local_padding);
      std::move(args).call(op, stack);
      grad_bias = stack->back().toTensor();
      stack->pop_back();
      grad_weight = stack->back().toTensor();
      stack->pop_back();
      grad_window = stack->back().toTensor();
      stack->pop_back();
    }
    stack->push_back(mask[0] ? moves.scatter_add_windows(grad_window) : at::Tensor());
    stack->push_back(mask[1] ? grad_weight : at::Tensor());
    stack->push_back(mask[2] ? grad_bias : at::Tensor());
  };
}

// Transposed convolution: this rank's rows' contributions, added where they land.
LocalKernel transposed_forward(const ConvolutionPlan& plan, const KernelMoves& moves) {
  return [plan = plan, moves = moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor input = args.tensor("input"), weight = args.tensor("weight");
    const c10::optional<at::Tensor> bias = args.optional_tensor("bias");
    at::Tensor contributions;
    if (empty_here(plan, input)) {  // no rows here, so no contributions
      contributions = at::zeros(local_result_shape(plan, input, weight.size(1) * plan.params.groups), input.options());
    } else {
      contributions = at::convolution(input, weight, c10::nullopt, plan.params.stride, plan.local_padding, plan.params.dilation,
                                      true, plan.local_output_padding, plan.params.groups);
    }
    at::Tensor output = moves.scatter_add_windows(contributions);
    if (bias && bias->defined()) {
      std::vector<int64_t> shape(output.dim(), 1);
      shape[1] = bias->numel();
      output.add_(bias->view(shape));
    }
    stack->push_back(output);
  };
}

LocalKernel transposed_backward(const ConvolutionPlan& plan, const KernelMoves& moves) {
  return [plan = plan, moves = moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor grad = args.tensor("grad_output"), input = args.tensor("input"), weight = args.tensor("weight");
    const c10::List<bool> output_mask = args.bool_list("output_mask");
    const std::vector<bool> mask = {output_mask.get(0), output_mask.get(1), output_mask.get(2)};
    const at::Tensor grad_window = moves.gather_windows(grad);
    at::Tensor grad_input, grad_weight;
    if (empty_here(plan, input) || grad_window.numel() == 0) {
      grad_input = at::zeros_like(input);
      grad_weight = at::zeros_like(weight);
    } else {
      std::tie(grad_input, grad_weight, std::ignore) = at::convolution_backward(
          grad_window, input, weight, c10::nullopt, plan.params.stride, plan.local_padding, plan.params.dilation, true,
          plan.local_output_padding, plan.params.groups, {mask[0], mask[1], false});
    }
    std::vector<int64_t> reduce_dims = {0};
    for (int64_t d = 2; d < grad.dim(); ++d) reduce_dims.push_back(d);
    stack->push_back(mask[0] ? grad_input : at::Tensor());
    stack->push_back(mask[1] ? grad_weight : at::Tensor());
    stack->push_back(mask[2] ? grad.sum(reduce_dims) : at::Tensor());
  };
}

}  // namespace

LocalKernel ConvolutionPlan::lower(const KernelMoves& moves) const {
  if (pass == Pass::Forward) return params.transposed ? transposed_forward(*this, moves) : regular_forward(*this, moves);
  return params.transposed ? transposed_backward(*this, moves) : regular_backward(*this, moves);
}

}  // namespace shardtensor
