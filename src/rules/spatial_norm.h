// The plan of batch norm and group norm over sharded dims (rules/spatial_norm.cpp declares
// it, kernels/spatial_norm.cpp runs it).
#pragma once

#include "rules/spatial.h"

namespace shardtensor {

struct SpatialNormPlan : KernelPlan {
  enum class Norm { Batch, Group };
  SpatialNormPlan(Norm n, bool is_backward, DeviceMesh m, std::vector<int64_t> dims, int64_t c)
      : norm(n), backward(is_backward), mesh(std::move(m)), mesh_dims(std::move(dims)), count(c) {}

  Norm norm;
  bool backward;
  DeviceMesh mesh;
  // The mesh dims the statistics are summed over (batch norm: every sharding one; group
  // norm: those sharding spatial dims, none when only the batch is split).
  std::vector<int64_t> mesh_dims;
  // Batch norm: elements per channel; group norm: spatial positions (HxW), both global.
  int64_t count;

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override;
  std::vector<MoveStep> moves() const override { return sums_over(mesh, mesh_dims); }
  MoveLowering move_lowering() const override { return {mesh}; }
};

// The dims a norm over [N, C, *] reduces per channel: 0, 2, 3, ... (the rule counts them, the
// kernel sums over them).
std::vector<int64_t> all_but_channel(int64_t ndim);

}  // namespace shardtensor
