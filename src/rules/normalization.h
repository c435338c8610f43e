// The plan of a layer norm over sharded rows (rules/normalization.cpp declares it,
// kernels/normalization.cpp runs it).
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

struct LayerNormGeometry {
  int64_t axis = 0;                   // first normalised dim
  std::vector<int64_t> row_mesh_dims;  // mesh dims splitting the normalised dims
  int64_t count = 1;                  // elements per row, global
};

// native_layer_norm (forward) and native_layer_norm_backward with the normalised dims
// sharded: each rank sums its piece of every row, one all-reduce per mesh dim of the stacked
// pair of row sums completes the statistics ([sum, sum of squares] forward; backward the two
// sums of the input gradient), and the rest is local.
struct LayerNormPlan : KernelPlan {
  enum class Pass { Forward, Backward };
  Pass pass;
  DeviceMesh mesh;
  LayerNormGeometry geometry;

  LayerNormPlan(Pass p, DeviceMesh m, LayerNormGeometry g) : pass(p), mesh(std::move(m)), geometry(std::move(g)) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override {
    return std::string("layer norm over sharded rows (") + (pass == Pass::Forward ? "forward" : "backward") + ")";
  }
  std::vector<MoveStep> moves() const override { return sums_over(mesh, geometry.row_mesh_dims); }
  MoveLowering move_lowering() const override { return {mesh}; }
};

}  // namespace shardtensor
