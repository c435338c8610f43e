// The plan of a pooling op over sharded spatial dims (rules/pooling.cpp declares it,
// kernels/pooling.cpp runs it).
#pragma once

#include <optional>

#include "rules/spatial.h"

namespace shardtensor {

enum class PoolKind { Max, Avg, AdaptiveAvg };

struct PoolPlan : KernelPlan {
  PoolPlan(PoolKind k, bool is_backward, DeviceMesh mesh) : kind(k), backward(is_backward), halo{std::move(mesh), {}} {}

  PoolKind kind;
  bool backward;
  int64_t spatial = 0;
  std::vector<int64_t> kernel, stride, dilation, global_lengths;
  std::vector<std::vector<Range>> outputs;  // per spatial dim, per rank
  // Avg: libtorch's divisor at every output position, as one factor per spatial dim (their
  // product), unless an override replaces it. The same on every rank; each kernel takes its
  // own outputs' stretch.
  std::vector<std::vector<double>> divisor_factors;
  std::optional<int64_t> divisor_override;
  HaloPlan halo;  // one axis per spatial dim for Max/Avg; the sharded dims for AdaptiveAvg

  int64_t my_outputs(size_t k) const { return outputs[k][halo.axes[k].me(halo.mesh)].size(); }

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override;
  std::vector<MoveStep> moves() const override;  // forward: halo gathers; backward: scatter-adds
  MoveLowering move_lowering() const override;
};

}  // namespace shardtensor
