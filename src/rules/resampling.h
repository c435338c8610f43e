// The plans of upsampling and padding along sharded spatial dims (rules/resampling.cpp
// declares them, kernels/resampling.cpp runs them).
#pragma once

#include "rules/spatial.h"

namespace shardtensor {

// Output o reads source positions taps[k][o] with weights weights[k][o], k = 0..K-1 (one tap:
// nearest and the pads; two: linear; four: cubic). Tap 0 is the first source, and every
// tap's positions are non-decreasing in o.
struct IndexMap {
  std::vector<std::vector<int64_t>> taps;
  std::vector<std::vector<double>> weights;  // empty: a plain gather of taps[0]
};

// One dim's map with its halo axis and the output range of every rank.
struct MapAxis {
  HaloAxis halo;
  IndexMap map;
  std::vector<Range> outputs;
};

// Upsampling and reflection/replication padding (forward), and their backward: per spatial
// dim, gather the window of sources and apply the map (backward: apply the transposed map and
// scatter the window gradient back).
struct IndexMapPlan : KernelPlan {
  explicit IndexMapPlan(DeviceMesh m) : mesh(std::move(m)) {}

  DeviceMesh mesh;
  std::vector<MapAxis> axes;
  int64_t ndim = 0;  // of the tensors the maps apply to
  bool backward = false;

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return backward ? "halo index map (backward)" : "halo index map (forward)"; }
  std::vector<MoveStep> moves() const override;
  MoveLowering move_lowering() const override;  // one halo axis per map axis
};

// An upsample backward on unsharded spatial dims: the operator on this rank's pieces, with the
// batch and channel entries of input_size (global in the call) made this rank's.
struct LocalInputSizePlan : KernelPlan {
  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "upsample backward with local input_size"; }
};

// constant_pad_nd along sharded dims: this rank's window gathered with the pad value as fill,
// then padded locally by `local_pad` (zero on the sharded dims).
struct ConstantPadPlan : KernelPlan {
  ConstantPadPlan(DeviceMesh mesh, double value) : halo{std::move(mesh), {}}, value(value) {}

  HaloPlan halo;
  double value;  // the pad value (part of the propagation's key, as every argument)
  std::vector<int64_t> local_pad;

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "constant pad over a halo window"; }
  std::vector<MoveStep> moves() const override { return halo_gathers(halo); }
  MoveLowering move_lowering() const override { return {halo.mesh, halo.axes, value}; }
};

}  // namespace shardtensor
