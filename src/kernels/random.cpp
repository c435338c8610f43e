// Sharding-invariant random operators: the kernels of the plans in rules/random.h (the rule
// file says why the values do not depend on the layout).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>

#include "comm/agreement.h"
#include "kernels/stack.h"
#include "rules/random.h"
#include "util/counter_random.h"

namespace shardtensor {
namespace {

// This rank's piece of a fresh draw, in double: uniform in [0, 1), or standard normal.
at::Tensor draw_piece(const ShardTensorSpec& spec, bool normal) {
  return counter_draws(spec.local_offsets(), spec.local_shape(), spec.shape(), next_random_key_on(spec.mesh()), normal);
}

}  // namespace

LocalKernel RandomFillPlan::lower() const {
  return [kind = kind, self = self, low = low, high = high](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const std::vector<c10::IValue> args = pop_arguments(op, stack);
    at::Tensor target = args[0].toTensor();
    at::Tensor values = draw_piece(self, kind == Draw::Normal || kind == Draw::LogNormal);
    auto parameter = [&](size_t i) { return args[i].toDouble(); };
    switch (kind) {
      case Draw::Uniform: values = values * (parameter(2) - parameter(1)) + parameter(1); break;
      case Draw::Normal: values = values * parameter(2) + parameter(1); break;
      case Draw::Bernoulli: values = (values < parameter(1)).to(at::kDouble); break;
      case Draw::Exponential: values = -at::log1p(-values) / parameter(1); break;
      case Draw::LogNormal: values = at::exp(values * parameter(2) + parameter(1)); break;
      case Draw::Cauchy: values = at::tan((values - 0.5) * M_PI) * parameter(2) + parameter(1); break;
      // u = 0 and p = 1 both give 1: log(1) / log(1 - p) is 0 (or -0) and floor keeps it.
      case Draw::Geometric: values = at::floor(at::log1p(-values) / std::log1p(-parameter(1))) + 1; break;
      case Draw::Integers: values = at::clamp_max(at::floor(values * (high - low)) + low, high - 1); break;
    }
    target.copy_(values);
    stack->push_back(target);
  };
}

// output = input * mask / (1 - p); not training: the input itself and an all-true mask.
LocalKernel DropoutPlan::lower() const {
  return [whole = whole](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor input = args[0].toTensor();
    const double p = args[1].toDouble();
    const bool train = args[2].isNone() || args[2].toBool();
    if (!train) {
      stack->push_back(input.clone());
      stack->push_back(at::ones_like(input, input.options().dtype(at::kBool)));
      return;
    }
    const at::Tensor mask = draw_piece(whole, false) < (1 - p);
    stack->push_back(p >= 1 ? at::zeros_like(input) : input * mask * (1 / (1 - p)));
    stack->push_back(mask);
  };
}

}  // namespace shardtensor
