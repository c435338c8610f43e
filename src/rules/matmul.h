// The plan of addmm/baddbmm with a Partial(sum) product (rules/matmul.cpp declares it,
// kernels/matmul.cpp runs it).
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

// Where the product is Partial(sum), only coordinate 0 of the `partial_mesh_dims` adds the
// bias (the others add a zero bias), or it would count once per term. No rank communicates:
// the output stays Partial(sum) and is resolved like any other.
struct BiasOncePlan : KernelPlan {
  DeviceMesh mesh;
  std::vector<int64_t> partial_mesh_dims;

  BiasOncePlan(DeviceMesh m, std::vector<int64_t> dims) : mesh(std::move(m)), partial_mesh_dims(std::move(dims)) {}

  LocalKernel lower() const override;
  std::string name() const override { return "product with its bias added once per Partial(sum)"; }
};

}  // namespace shardtensor
