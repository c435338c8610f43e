// Upsampling and padding along sharded spatial dims: the kernels of IndexMapPlan,
// LocalInputSizePlan and ConstantPadPlan (rules/resampling.h; the rule file says how each
// layout is handled).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "domain/kernel_moves.h"
#include "kernels/host_values.h"
#include "kernels/stack.h"
#include "rules/resampling.h"

namespace shardtensor {
namespace {

// One map axis as this rank applies it, built once when the plan is lowered: its slice of the
// map, relative to its window (the halo axis of the same index in the kernel's moves): per
// tap, the sources of its outputs and their weights (shaped to broadcast along the dim; none
// for one-tap maps). On the mesh's device, where the pieces they index live.
struct LocalMap {
  std::vector<at::Tensor> sources, weights;
};

at::Tensor local_indices(const std::vector<int64_t>& all, Range mine, int64_t window_begin, c10::Device device) {
  std::vector<int64_t> v(all.begin() + mine.begin, all.begin() + mine.end);
  for (int64_t& i : v) i -= window_begin;
  return host_tensor(v, device);
}

LocalMap slice_for_this_rank(const MapAxis& a, const DeviceMesh& mesh, int64_t ndim) {
  LocalMap local;
  if (!mesh.includes_this_rank()) return local;  // it runs no kernel (dispatch/kernel.cpp)
  const int64_t me = a.halo.me(mesh);
  const Range mine = a.outputs[me];
  std::vector<int64_t> shape(ndim, 1);
  shape[a.halo.tensor_dim] = mine.size();
  for (size_t k = 0; k < a.map.taps.size(); ++k) {
    local.sources.push_back(local_indices(a.map.taps[k], mine, a.halo.window[me].begin, mesh.device()));
    if (a.map.weights.empty()) continue;
    const std::vector<double>& w = a.map.weights[k];
    local.weights.push_back(host_tensor(std::vector<double>(w.begin() + mine.begin, w.begin() + mine.end), mesh.device()).view(shape));
  }
  return local;
}

at::Tensor apply_forward(const KernelMoves& moves, const std::vector<LocalMap>& maps, at::Tensor x) {
  for (size_t i = 0; i < maps.size(); ++i) {
    const LocalMap& a = maps[i];
    const int64_t d = moves.halo_axis(i).axis.tensor_dim;
    x = moves.gather_window(i, x);
    if (a.weights.empty()) {
      x = x.index_select(d, as_operand(a.sources[0], x).to(x.device()));
      continue;
    }
    at::Tensor sum;
    for (size_t k = 0; k < a.sources.size(); ++k) {
      const at::Tensor term = x.index_select(d, as_operand(a.sources[k], x).to(x.device())) * as_operand(a.weights[k], x).to(x.options());
      sum = k == 0 ? term : sum + term;
    }
    x = sum;
  }
  return x;
}

at::Tensor apply_backward(const KernelMoves& moves, const std::vector<LocalMap>& maps, at::Tensor grad) {
  for (size_t i = maps.size(); i-- > 0;) {
    const LocalMap& a = maps[i];
    const LoweredHaloAxis& axis = moves.halo_axis(i);
    const int64_t d = axis.axis.tensor_dim;
    std::vector<int64_t> shape = grad.sizes().vec();
    shape[d] = axis.axis.window[axis.me].size();
    at::Tensor g = at::zeros(shape, grad.options());
    for (size_t k = 0; k < a.sources.size(); ++k)
      g.index_add_(d, as_operand(a.sources[k], grad).to(grad.device()),
                   a.weights.empty() ? grad : grad * as_operand(a.weights[k], grad).to(grad.options()));
    grad = moves.scatter_add_window(i, g);
  }
  return grad;
}

}  // namespace

LocalKernel IndexMapPlan::lower(const KernelMoves& moves) const {
  std::vector<LocalMap> maps;
  for (const MapAxis& a : axes) maps.push_back(slice_for_this_rank(a, mesh, ndim));
  return [moves, backward = backward, maps](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    // Forward: upsample_*(self, ...) and the reflection and replication pads (self, padding);
    // backward: their backwards (grad_output, ...). The rules are registered for the base
    // overloads only: the upsample .vec ones, which call their input `input`, never get here.
    const OpArguments args(op, stack);
    stack->push_back(backward ? apply_backward(moves, maps, args.tensor("grad_output")) : apply_forward(moves, maps, args.tensor("self")));
  };
}

LocalKernel LocalInputSizePlan::lower(const KernelMoves&) const {
  return [](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    OpArguments args(op, stack);
    std::vector<int64_t> input_size = args.int_list("input_size");
    const at::Tensor grad = args.tensor("grad_output");
    for (int64_t d = 0; d < grad.dim() - static_cast<int64_t>(args.int_list("output_size").size()); ++d) input_size[d] = grad.size(d);
    args.set("input_size", input_size);
    std::move(args).call(op, stack);
  };
}

LocalKernel ConstantPadPlan::lower(const KernelMoves& moves) const {
  const LocalKernel pad_locally = EmptySafePlan().lower(KernelMoves());
  return [moves, local_pad = local_pad, pad_locally](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    OpArguments args(op, stack);
    args.set("self", moves.gather_windows(args.tensor("self")));
    args.set("pad", local_pad);
    std::move(args).push(stack);
    pad_locally(op, stack);
  };
}

}  // namespace shardtensor
