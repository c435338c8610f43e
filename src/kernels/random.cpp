// Sharding-invariant random operators: the kernels of the plans in rules/random.h (the rule
// file says why the values do not depend on the layout).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>

#include "comm/agreement.h"  // next_random_key_on
#include "domain/kernel_moves.h"
#include "kernels/stack.h"
#include "redistribute/boxes.h"
#include "rules/random.h"
#include "util/counter_random.h"

namespace shardtensor {
namespace {

// This rank's piece of a fresh draw, in double: uniform in [0, 1), or standard normal.
at::Tensor draw_piece(const ShardTensorSpec& spec, bool normal) {
  return counter_draws(spec.local_offsets(), spec.local_shape(), spec.shape(), next_random_key_on(spec.mesh()), normal);
}

// Uniform draws in [0, 1) as integers in [low, high), as random_ and randint_like draw them.
at::Tensor integers_in(const at::Tensor& uniform, double low, double high) {
  return at::clamp_max(at::floor(uniform * (high - low)) + low, high - 1);
}

}  // namespace

LocalKernel RandomFillPlan::lower(const KernelMoves& moves) const {
  return [kind = kind, self = self, low = low, high = high](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    at::Tensor target = args.tensor("self");
    at::Tensor values = draw_piece(self, kind == Draw::Normal || kind == Draw::LogNormal);
    auto parameter = [&](const char* name) { return args.to_double(name); };
    // Each kind is one operator (rules/random.cpp registers them), its parameters named as there.
    switch (kind) {
      case Draw::Uniform: values = values * (parameter("to") - parameter("from")) + parameter("from"); break;
      case Draw::Normal: values = values * parameter("std") + parameter("mean"); break;
      case Draw::Bernoulli: values = (values < parameter("p")).to(at::kDouble); break;
      case Draw::Exponential: values = -at::log1p(-values) / parameter("lambd"); break;
      case Draw::LogNormal: values = at::exp(values * parameter("std") + parameter("mean")); break;
      case Draw::Cauchy: values = at::tan((values - 0.5) * M_PI) * parameter("sigma") + parameter("median"); break;
      // u = 0 and p = 1 both give 1: log(1) / log(1 - p) is 0 (or -0) and floor keeps it.
      case Draw::Geometric: values = at::floor(at::log1p(-values) / std::log1p(-parameter("p"))) + 1; break;
      case Draw::Integers: values = integers_in(values, low, high); break;
    }
    target.copy_(values);
    stack->push_back(target);
  };
}

namespace {

// This rank's box of `whole`, a tensor of `spec`'s global shape, as a view.
at::Tensor box_of_whole(const at::Tensor& whole, const ShardTensorSpec& spec) {
  const Box mine = box_of(spec, spec.mesh().coordinate());
  at::Tensor view = whole;
  for (int64_t d = 0; d < view.dim(); ++d) view = view.narrow(d, mine.offsets[d], mine.shape[d]);
  return view;
}

// Raises on every rank if any rank of the declared groups found `bad` (one sum of flags): the
// data being checked is sharded, so one rank alone may hold the bad value.
void check_on_every_rank(const DeviceMesh& mesh, const KernelMoves& sum_of_flags, bool bad, const std::string& message) {
  at::Tensor flags = at::full({1}, bad ? 1.0 : 0.0, at::TensorOptions().dtype(at::kFloat).device(mesh.device()));
  sum_of_flags.all_reduce(flags);
  TORCH_CHECK(flags.item<float>() == 0, message, bad ? "" : " (on another rank)");
}

}  // namespace

LocalKernel RandomLikePlan::lower(const KernelMoves& moves) const {
  return [kind = kind, layout = layout, low = low, high = high](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    // Not the local factory itself: it would draw from torch's generator, a different number of
    // values on each rank, and leave the ranks' later torch.rand calls out of step.
    const OpArguments args(op, stack);
    auto given = [&](const char* name) -> const c10::IValue* {
      return args.has(name) && !args.is_none(name) ? &args.value(name) : nullptr;
    };
    const at::Tensor self = args.tensor("self");
    c10::TensorOptions options = self.options();
    if (const c10::IValue* dtype = given("dtype")) options = options.dtype(dtype->toScalarType());
    const c10::IValue* format = given("memory_format");
    at::Tensor out = at::empty_like(self, options, format ? format->toMemoryFormat() : c10::MemoryFormat::Preserve);
    at::Tensor values = draw_piece(layout, kind == Draw::Normal);
    if (kind == Draw::Integers) values = integers_in(values, low, high);
    out.copy_(values);
    stack->push_back(out);
  };
}

LocalKernel BernoulliPlan::lower(const KernelMoves& moves) const {
  return [form = form, self = self, broadcasts = p_broadcasts, check = moves](
             const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor target = args.tensor("self");
    at::Tensor p;
    if (form == BernoulliPlan::Form::ProbabilitiesInSelf) {
      p = target;
    } else if (form == BernoulliPlan::Form::InPlaceTensorP) {
      p = args.tensor("p");
      if (broadcasts) p = box_of_whole(p.expand(self.shape()), self);  // the whole p, expanded, then this rank's box
    }
    if (p.defined()) {
      const bool bad = p.numel() > 0 && !((p >= 0) & (p <= 1)).all().item<bool>();
      check_on_every_rank(self.mesh(), check, bad, op.schema().name() + ": expects all elements of p to be in [0, 1]");
    }
    const at::Tensor u = draw_piece(self, false);
    const at::Tensor ones = p.defined() ? u < p.to(at::kDouble) : u < args.to_double("p");
    if (form == BernoulliPlan::Form::InPlaceTensorP) {
      target.copy_(ones);
      stack->push_back(target);
    } else {
      stack->push_back(ones.to(target.options()));
    }
  };
}

LocalKernel MultinomialPlan::lower(const KernelMoves& moves) const {
  return [in = probabilities, n = num_samples, replacement = replacement, check = moves](
             const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor local = args.tensor("self");
    const bool one_row = local.dim() == 1;
    const at::Tensor rows = (one_row ? local.unsqueeze(0) : local).to(at::kDouble);
    const int64_t first_row = one_row ? 0 : in.local_offsets()[0], total_rows = one_row ? 1 : in.shape()[0];
    // torch's checks on the values, made for every row on every rank.
    const at::Tensor nonzero = (rows > 0).sum(1);
    const bool bad_values = rows.numel() > 0 && !(at::isfinite(rows).all().item<bool>() && (rows >= 0).all().item<bool>());
    const bool bad_rows = rows.size(0) > 0 && (replacement ? (nonzero == 0) : (nonzero < n)).any().item<bool>();
    check_on_every_rank(in.mesh(), check, bad_values || bad_rows,
                        op.schema().name() + ": invalid multinomial distribution (negative, infinite or NaN probabilities, " +
                            (replacement ? "or a row whose probabilities sum to 0)"
                                         : "or a row with fewer non-zero categories than num_samples without replacement)"));
    at::Tensor samples;
    if (replacement) {
      // The draw at global (row, sample) inverts the row's CDF; zero-probability categories
      // have empty intervals and are never chosen.
      const at::Tensor u = counter_draws({first_row, 0}, {rows.size(0), n}, {total_rows, n}, next_random_key_on(in.mesh()), false);
      const at::Tensor cdf = rows.cumsum(1);
      const at::Tensor scaled = u * cdf.narrow(1, cdf.size(1) - 1, 1);
      samples = at::searchsorted(cdf, scaled, /*out_int32=*/false, /*right=*/true).clamp_max(rows.size(1) - 1);
    } else {
      // Efraimidis-Spirakis: the n largest keys log(u) / p, u at global (row, category).
      const at::Tensor u = counter_draws({first_row, 0}, {rows.size(0), rows.size(1)}, {total_rows, rows.size(1)},
                                         next_random_key_on(in.mesh()), false);
      const at::Tensor keys = at::log(u) / rows;  // -inf where p = 0, never chosen (enough non-zero rows checked)
      samples = std::get<1>(keys.topk(n, 1));
    }
    stack->push_back(one_row ? samples.squeeze(0) : samples);
  };
}

// output = input * mask / (1 - p); not training: the input itself and an all-true mask.
LocalKernel DropoutPlan::lower(const KernelMoves& moves) const {
  return [whole = whole](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor input = args.tensor("input");
    const double p = args.to_double("p");
    const bool train = args.is_none("train") || args.to_bool("train");
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
