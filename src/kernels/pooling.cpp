// Pooling over sharded spatial dims: the kernels of PoolPlan (rules/pooling.h; the rule file
// says how each layout is handled).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>

#include "domain/kernel_moves.h"
#include "kernels/host_values.h"
#include "util/below_tracer_modes.h"
#include "kernels/stack.h"
#include "rules/pooling.h"

namespace shardtensor {
namespace {

// Average pooling's divisor at this rank's outputs (double, on the mesh's device), shaped to
// broadcast over them: each dim's factors at the outputs this rank owns.
at::Tensor divisor_of(const PoolPlan& plan, int64_t ndim) {
  const BelowTracerModes real_bytes;  // a host value (host_values.h), however the plan is lowered
  at::Tensor divisor = at::ones({}, at::kDouble);
  if (plan.divisor_override) return divisor.fill_(static_cast<double>(*plan.divisor_override));
  for (int64_t i = 0; i < plan.spatial; ++i) {
    const Range mine = plan.outputs[i][plan.halo.axes[i].me(plan.halo.mesh)];
    const std::vector<double> factors(plan.divisor_factors[i].begin() + mine.begin, plan.divisor_factors[i].begin() + mine.end);
    std::vector<int64_t> shape(ndim, 1);
    shape[ndim - plan.spatial + i] = mine.size();
    divisor = divisor * host_tensor(factors, plan.halo.mesh.device()).view(shape);
  }
  return divisor;
}

// `t` (shaped like this rank's outputs) divided by the divisor, in t's dtype and device.
at::Tensor divided(const at::Tensor& divisor, const at::Tensor& t) {
  return (t / as_operand(divisor, t).to(t.device())).to(t.scalar_type());
}

std::vector<int64_t> zero_list(int64_t n) { return std::vector<int64_t>(n, 0); }

// Shape of this rank's pooled output (for ranks with nothing to pool).
std::vector<int64_t> my_output_shape(const PoolPlan& plan, std::vector<int64_t> shape) {
  for (size_t k = 0; k < plan.halo.axes.size(); ++k) shape[plan.halo.axes[k].tensor_dim] = plan.my_outputs(k);
  return shape;
}

// Flat index over the spatial dims: window-local <-> global.
at::Tensor window_to_global(const PoolPlan& plan, at::Tensor idx, const at::Tensor& window) {
  at::Tensor global = at::zeros_like(idx);
  for (int64_t k = plan.spatial - 1, inner = 1; k >= 0; --k) {
    const HaloAxis& a = plan.halo.axes[k];
    const int64_t w = window.size(a.tensor_dim);
    const at::Tensor coord = idx.remainder(w) + a.window[a.me(plan.halo.mesh)].begin;
    idx = idx.div(w, "floor");
    global.add_(coord * inner);
    inner *= plan.global_lengths[k];
  }
  return global;
}

at::Tensor global_to_window(const PoolPlan& plan, at::Tensor idx, const std::vector<int64_t>& window_shape) {
  at::Tensor local = at::zeros_like(idx);
  for (int64_t k = plan.spatial - 1, inner = 1; k >= 0; --k) {
    const HaloAxis& a = plan.halo.axes[k];
    const at::Tensor coord = idx.remainder(plan.global_lengths[k]) - a.window[a.me(plan.halo.mesh)].begin;
    idx = idx.div(plan.global_lengths[k], "floor");
    local.add_(coord * inner);
    inner *= window_shape[a.tensor_dim];
  }
  return local;
}

// Runs a pooling op on this rank's window: gathers it (filled with the halo's fill outside the field),
// lets `adjust` rewrite the arguments for it, runs the op and `finish`es its outputs. A rank
// with nothing to pool returns zeros of its (empty) output shape, indices as long.
template <typename Adjust, typename Finish>
void forward_on_window(const PoolPlan& plan, const KernelMoves& moves, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       Adjust adjust, Finish finish) {
  OpArguments args(op, stack);
  const at::Tensor window = moves.gather_windows(args.tensor("self"));
  adjust(args, window);
  if (window.numel() == 0) {
    // Sliding pools have an axis per spatial dim; adaptive pooling only for the sharded ones,
    // its other spatial dims take the output size it was given (the same on every rank).
    std::vector<int64_t> shape = my_output_shape(plan, window.sizes().vec());
    if (plan.kind == PoolKind::AdaptiveAvg) {
      const std::vector<int64_t> out_size = args.int_list("output_size");
      std::copy(out_size.begin(), out_size.end(), shape.end() - plan.spatial);
    }
    for (size_t k = 0; k < op.schema().returns().size(); ++k)
      stack->push_back(at::zeros(shape, window.options().dtype(k == 0 ? window.scalar_type() : at::kLong)));
    return;
  }
  args.set("self", window);
  std::move(args).call(op, stack);
  finish(stack, window);
}

// Runs a pooling backward on this rank's window, then scatters the window gradient to the
// ranks that own it. The op reads only self's shape, so an empty tensor of the window's shape
// stands in for it (no input halo moves); `adjust` rewrites the other arguments.
template <typename Adjust>
void backward_on_window(const PoolPlan& plan, const KernelMoves& moves, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        Adjust adjust) {
  OpArguments args(op, stack);
  const at::Tensor self = args.tensor("self");
  const std::vector<int64_t> window_shape = plan.halo.window_shape(self.sizes().vec());
  at::Tensor grad_window = at::zeros(window_shape, self.options());
  if (args.tensor("grad_output").numel() > 0) {
    args.set("self", at::empty(window_shape, self.options()));
    adjust(args, window_shape);
    std::move(args).call(op, stack);
    grad_window = stack->back().toTensor();
    stack->pop_back();
  }
  stack->push_back(moves.scatter_add_windows(grad_window));
}

// max_poolNd_with_indices(self, kernel, stride, padding, dilation, ceil_mode) -> (out, indices)
LocalKernel max_pool_forward(const PoolPlan& plan, const KernelMoves& moves) {
  return [plan = plan, moves = moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    forward_on_window(
        plan, moves, op, stack,
        [&](OpArguments& args, const at::Tensor&) {
          args.set("padding", zero_list(plan.spatial));  // in the window already
          args.set("ceil_mode", false);                  // likewise
        },
        [&](torch::jit::Stack* out, const at::Tensor& window) { out->back() = window_to_global(plan, out->back().toTensor(), window); });
  };
}

// max_poolNd_with_indices_backward(grad_output, self, kernel, stride, padding, dilation, ceil_mode, indices)
LocalKernel max_pool_backward(const PoolPlan& plan, const KernelMoves& moves) {
  return [plan = plan, moves = moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    backward_on_window(plan, moves, op, stack, [&](OpArguments& args, const std::vector<int64_t>& window_shape) {
      args.set("padding", zero_list(plan.spatial));
      args.set("ceil_mode", false);
      args.set("indices", global_to_window(plan, args.tensor("indices"), window_shape));
    });
  };
}

// avg_poolNd(self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
// the window sum (divisor 1), divided by libtorch's divisor for each output.
LocalKernel avg_pool_forward(const PoolPlan& plan, const KernelMoves& moves, const at::Tensor& divisor) {
  return [plan = plan, moves = moves, divisor](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    forward_on_window(
        plan, moves, op, stack,
        [&](OpArguments& args, const at::Tensor&) {
          args.set("padding", zero_list(plan.spatial));
          args.set("ceil_mode", false);
          args.set("count_include_pad", true);
          args.set("divisor_override", int64_t{1});
        },
        [&](torch::jit::Stack* out, const at::Tensor&) { out->back() = divided(divisor, out->back().toTensor()); });
  };
}

// avg_poolNd_backward(grad_output, self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
LocalKernel avg_pool_backward(const PoolPlan& plan, const KernelMoves& moves, const at::Tensor& divisor) {
  return [plan = plan, moves = moves, divisor](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    backward_on_window(plan, moves, op, stack, [&](OpArguments& args, const std::vector<int64_t>&) {
      args.set("grad_output", divided(divisor, args.tensor("grad_output")));
      args.set("padding", zero_list(plan.spatial));
      args.set("ceil_mode", false);
      args.set("count_include_pad", true);
      args.set("divisor_override", int64_t{1});
    });
  };
}

// _adaptive_avg_poolNd(self, output_size): the local op on the window, sharded dims' output
// sizes made local.
LocalKernel adaptive_forward(const PoolPlan& plan, const KernelMoves& moves) {
  return [plan = plan, moves = moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    forward_on_window(
        plan, moves, op, stack,
        [&](OpArguments& args, const at::Tensor& window) {
          std::vector<int64_t> out_size = args.int_list("output_size");
          for (size_t k = 0; k < plan.halo.axes.size(); ++k)
            out_size[plan.halo.axes[k].tensor_dim - (window.dim() - plan.spatial)] = plan.my_outputs(k);
          args.set("output_size", out_size);
        },
        [](torch::jit::Stack*, const at::Tensor&) {});
  };
}

// _adaptive_avg_poolNd_backward(grad_output, self)
LocalKernel adaptive_backward(const PoolPlan& plan, const KernelMoves& moves) {
  return [plan = plan, moves = moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    backward_on_window(plan, moves, op, stack, [](OpArguments&, const std::vector<int64_t>&) {});
  };
}

}  // namespace

LocalKernel PoolPlan::lower(const KernelMoves& moves) const {
  switch (kind) {
    case PoolKind::Max:
      return backward ? max_pool_backward(*this, moves) : max_pool_forward(*this, moves);
    case PoolKind::Avg: {
      const int64_t ndim = halo.axes.empty() ? 0 : static_cast<int64_t>(halo.axes.front().tensor_dim) + spatial;
      // A rank outside the mesh runs no kernel (dispatch/kernel.cpp) and has no divisor.
      const at::Tensor divisor = halo.mesh.includes_this_rank() ? divisor_of(*this, ndim) : at::Tensor();
      return backward ? avg_pool_backward(*this, moves, divisor) : avg_pool_forward(*this, moves, divisor);
    }
    case PoolKind::AdaptiveAvg:
      return backward ? adaptive_backward(*this, moves) : adaptive_forward(*this, moves);
  }
  return {};
}

}  // namespace shardtensor
