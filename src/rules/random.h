// The plans of the random rules (rules/random.cpp declares them, kernels/random.cpp runs
// them): every element's value comes from the counter-based generator, keyed by its global
// position, so they need nothing but the spec of the piece they fill.
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

enum class Draw { Uniform, Normal, Bernoulli };

// uniform_(self, from, to, generator?), normal_(self, mean, std, generator?),
// bernoulli_.float(self, p, generator?): self's piece filled in place.
struct RandomFillPlan : KernelPlan {
  Draw kind;
  ShardTensorSpec self;  // the layout the filled tensor runs on

  RandomFillPlan(Draw k, ShardTensorSpec s) : kind(k), self(std::move(s)) {}

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
