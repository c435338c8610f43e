// Halo exchange: the data movement of domain parallelism.
//
// A spatial op (convolution, pooling, resampling, padding) computes the outputs a rank owns
// from a *window* of its input that reaches past its own shard. Along one tensor dim split
// over the group of one mesh dim, every rank knows, for every group rank, the range it owns
// and the window it needs (pure functions of the layout, computed by the rules), so each
// rank can send exactly the intersections others need, no padding to the largest shard, any
// shard size (a window may span several neighbours, so shards smaller than the halo work), and
// no exchange at all when no window crosses a boundary. Which stretches move is lowered once
// per cached kernel (LoweredHalo below). The transport is chosen per call as a redistribute
// step's is (redistribute/transport.h, under the transport options in force): on local CPU
// ranks each rank reads its stretches straight from its neighbours' memory (no pack, no
// socket); elsewhere one all-to-all with split sizes. The adjoint, scatter_add_window, sends
// window pieces back to their owners and adds them: the backward of a gather, and the forward
// of a transposed convolution.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "redistribute/lowered_step.h"
#include "spec/halo_geometry.h"

namespace shardtensor {

// One halo axis lowered for this rank: its gather and its adjoint scatter-add, the two steps a
// kernel runs along it (redistribute/lowered_step.h), sharing the axis's lowering (which
// stretches move between which ranks), made once, when the kernel is lowered (its propagation
// cached). A call only chooses the transport, under the options then in force, and moves bytes.
struct HaloAxisSteps {
  // Window positions outside the field hold `fill` (or wrap around, on a periodic axis).
  HaloAxisSteps(const HaloAxis& axis, const DeviceMesh& mesh, double fill = 0.0);

  const LoweredHaloAxis& lowered() const { return gather.halo(); }

  LoweredStep gather, scatter_add;

 private:
  HaloAxisSteps(const std::shared_ptr<const LoweredHaloAxis>& lowered, double fill);
};

// Every axis of a HaloPlan, lowered, in the plan's order; the steps that move bytes are
// exactly those the plan declares (rules/kernel_plan.h: halo_gathers, halo_scatter_adds).
struct LoweredHalo {
  explicit LoweredHalo(const HaloPlan& plan, double fill = 0.0);

  DeviceMesh mesh;
  std::vector<HaloAxisSteps> axes;
};

// This rank's window of `owned_piece` along the axis: the neighbours' pieces arrive by one
// exchange on the axis's mesh-dim group.
at::Tensor gather_window(const at::Tensor& owned_piece, const HaloAxisSteps& axis, const DeviceMesh& mesh);

// The adjoint: `window_piece` covers this rank's window; every position is added to the rank
// that owns it (positions outside [0, length) are dropped, or wrap around on a periodic axis).
// Returns this rank's owned piece.
at::Tensor scatter_add_window(const at::Tensor& window_piece, const HaloAxisSteps& axis, const DeviceMesh& mesh);

// Every axis in turn: the window of `owned` (gather_window per axis, in order), and its
// adjoint (scatter_add_window per axis, in reverse).
at::Tensor gather_windows(const LoweredHalo& halo, at::Tensor owned);
at::Tensor scatter_add_windows(const LoweredHalo& halo, at::Tensor window);

}  // namespace shardtensor
