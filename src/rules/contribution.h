// The contribution rule: how a value every rank holds (a Replicate operand, a scalar argument)
// joins a Partial result (rules declare it, kernels/contribution.cpp runs it).
//
// A Partial(sum) result is a pending sum of one term per rank of each Partial mesh dim. A
// replicated value that enters it (the bias of addmm, the `other` of P(sum) + R, the `value`
// that fill_ or copy_ writes into a Partial(sum), a Replicate operand of cat or stack next to
// Partial(sum) ones) must be counted once, not once per term: the
// rank at coordinate 0 of each such mesh dim contributes it, the others contribute zero. That
// is exact (no division by the group size, so integers work) and needs no communication: the
// output stays Partial(sum) and is resolved like any other. Partial(avg/max/min) need no rule:
// the average, maximum or minimum of one value held by every term is that value.
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

// One replicated value: its schema position (a tensor or a scalar) and the Partial(sum) mesh
// dims it joins. A rank off coordinate 0 of any of them passes a zero instead. `element`: the
// value is that tensor of a Tensor[] argument (cat's and stack's operands), -1: the argument.
struct ContributedValue {
  size_t arg;
  std::vector<int64_t> mesh_dims;
  int64_t element = -1;
};

struct ContributedOncePlan : KernelPlan {
  DeviceMesh mesh;
  std::vector<ContributedValue> values;

  ContributedOncePlan(DeviceMesh m, std::vector<ContributedValue> v) : mesh(std::move(m)), values(std::move(v)) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "replicated values contributed once to a Partial(sum)"; }
};

}  // namespace shardtensor
