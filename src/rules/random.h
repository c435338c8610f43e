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

  LocalKernel lower() const override;
  std::string name() const override;
};

// native_dropout(input, p, train?) -> (output, mask): the mask drawn for `whole`'s piece.
struct DropoutPlan : KernelPlan {
  ShardTensorSpec whole;  // the input's layout without Partial

  explicit DropoutPlan(ShardTensorSpec w) : whole(std::move(w)) {}

  LocalKernel lower() const override;
  std::string name() const override { return "counter-based dropout"; }
};

}  // namespace shardtensor
