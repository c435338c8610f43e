// The plans of the random rules (rules/random.cpp declares them, kernels/random.cpp runs
// them): every element's value comes from the counter-based generator, keyed by its global
// position, so they need nothing but the spec of the piece they fill.
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

// Every fill transforms one uniform (or standard normal) draw per element, so each stays
// sharding-invariant: Exponential -log(1-u)/lambd, LogNormal exp(mean + std n), Cauchy
// median + sigma tan(pi (u - 1/2)), Geometric floor(log(1-u) / log(1-p)) + 1, Integers
// low + floor(u (high - low)).
enum class Draw { Uniform, Normal, Bernoulli, Exponential, LogNormal, Cauchy, Geometric, Integers };

// uniform_(self, from, to, generator?), normal_(self, mean, std, generator?),
// bernoulli_.float(self, p, generator?), exponential_(self, lambd, generator?),
// log_normal_(self, mean, std, generator?), cauchy_(self, median, sigma, generator?),
// geometric_(self, p, generator?), random_[.from|.to](...): self's piece filled in place.
struct RandomFillPlan : KernelPlan {
  Draw kind;
  ShardTensorSpec self;  // the layout the filled tensor runs on
  double low = 0, high = 0;  // Integers: the range [low, high) the rule read from random_'s overload

  RandomFillPlan(Draw k, ShardTensorSpec s, double lo = 0, double hi = 0) : kind(k), self(std::move(s)), low(lo), high(hi) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override;
  int64_t random_keys_drawn(c10::ArrayRef<c10::IValue>) const override { return 1; }
};

// rand_like, randn_like, randint_like[.low_dtype](self, [low,] high): a fresh tensor laid out
// like self (Partial made Replicate), drawn as the fills are. Uniform, Normal or Integers.
struct RandomLikePlan : KernelPlan {
  Draw kind;
  ShardTensorSpec layout;
  double low = 0, high = 0;  // Integers

  RandomLikePlan(Draw k, ShardTensorSpec s, double lo = 0, double hi = 0) : kind(k), layout(std::move(s)), low(lo), high(hi) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "counter-based random factory"; }
  int64_t random_keys_drawn(c10::ArrayRef<c10::IValue>) const override { return 1; }
};

// bernoulli(self) (self holds the probabilities), bernoulli.p(self, p) (a fresh tensor like
// self) and bernoulli_.Tensor(self, p) (in place): 1 where the element's uniform draw is below
// its probability. A tensor p that is not self's shape comes whole (`p_broadcasts`) and is
// expanded to self's piece. Sharded probabilities are checked to be in [0, 1] with one sum of
// flags over `check_mesh_dims`, so that every rank raises if any rank holds a bad one.
struct BernoulliPlan : KernelPlan {
  enum class Form { ProbabilitiesInSelf, ScalarP, InPlaceTensorP };
  Form form;
  ShardTensorSpec self;
  bool p_broadcasts = false;
  std::vector<int64_t> check_mesh_dims;

  BernoulliPlan(Form f, ShardTensorSpec s, bool broadcasts, std::vector<int64_t> check)
      : form(f), self(std::move(s)), p_broadcasts(broadcasts), check_mesh_dims(std::move(check)) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "counter-based bernoulli draw"; }
  std::vector<MoveStep> moves() const override { return sums_over(self.mesh(), check_mesh_dims); }
  MoveLowering move_lowering() const override { return {self.mesh()}; }
  int64_t random_keys_drawn(c10::ArrayRef<c10::IValue>) const override { return 1; }
};

// multinomial(self, num_samples, replacement, generator?): rows (dim 0 of a 2-d self) may be
// sharded, the categories are whole. With replacement each sample inverts the row's CDF at
// the draw of its global (row, sample) position; without, the categories with the largest
// u^(1/p) keys (Efraimidis-Spirakis), u drawn at the global (row, category) position. Either
// way the samples do not depend on the layout. Rows are checked (non-negative, finite, enough
// non-zero categories) with one sum of flags over `check_mesh_dims`.
struct MultinomialPlan : KernelPlan {
  ShardTensorSpec probabilities;  // categories whole, no Partial
  int64_t num_samples;
  bool replacement;
  std::vector<int64_t> check_mesh_dims;

  MultinomialPlan(ShardTensorSpec p, int64_t n, bool with_replacement, std::vector<int64_t> check)
      : probabilities(std::move(p)), num_samples(n), replacement(with_replacement), check_mesh_dims(std::move(check)) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "counter-based multinomial draw"; }
  std::vector<MoveStep> moves() const override { return sums_over(probabilities.mesh(), check_mesh_dims); }
  MoveLowering move_lowering() const override { return {probabilities.mesh()}; }
  int64_t random_keys_drawn(c10::ArrayRef<c10::IValue>) const override { return 1; }
};

// native_dropout(input, p, train?) -> (output, mask): the mask drawn for `whole`'s piece.
struct DropoutPlan : KernelPlan {
  ShardTensorSpec whole;  // the input's layout without Partial

  explicit DropoutPlan(ShardTensorSpec w) : whole(std::move(w)) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "counter-based dropout"; }
  // Draws only in training (argument 2, `train`, None or true), as lower() does.
  int64_t random_keys_drawn(c10::ArrayRef<c10::IValue> arguments) const override {
    return arguments.size() > 2 && !arguments[2].isNone() && !arguments[2].toBool() ? 0 : 1;
  }
};

}  // namespace shardtensor
