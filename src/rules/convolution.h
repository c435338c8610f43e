// The plan of a halo convolution (rules/convolution.cpp declares it, kernels/convolution.cpp
// runs it): the convolution's parameters, the halo axes of its sharded spatial dims, and the
// padding left for the local op once the window carries the sharded dims' padding.
#pragma once

#include "rules/spatial.h"

namespace shardtensor {

struct ConvParams {
  int64_t spatial = 0;
  std::vector<int64_t> kernel, stride, padding, dilation, output_padding;
  bool transposed = false;
  int64_t groups = 1;

  int64_t extent(int64_t i) const { return dilation[i] * (kernel[i] - 1) + 1; }
};

struct ConvolutionPlan : KernelPlan {
  enum class Pass { Forward, Backward };
  explicit ConvolutionPlan(DeviceMesh mesh) : halo{std::move(mesh), {}} {}

  Pass pass = Pass::Forward;
  ConvParams params;
  HaloPlan halo;
  std::vector<std::vector<Range>> outputs;  // per axis: the output range of every rank
  std::vector<int64_t> local_padding, local_output_padding;

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override;
  // Regular: gather the input window (backward: and scatter-add its gradient back).
  // Transposed: scatter-add the contributions (backward: gather the gradient's window).
  std::vector<MoveStep> moves() const override;
  MoveLowering move_lowering() const override { return {halo.mesh, halo.axes}; }
};

}  // namespace shardtensor
