// How a built-in rule asks for local compute beyond calling the operator on the local pieces.
//
// Rules stay pure: they see metadata and return layouts. When an op needs more than that (a
// halo window gathered before the local convolution, a mean divided by the global count,
// statistics summed over the shards of a norm), the rule returns a KernelPlan: a const
// description of that computation and of every move it makes between ranks (moves()). The
// code that runs a plan lives in src/kernels/, one file per family, which defines the plan's
// lower(). Dispatch lowers a plan once, when the propagation that made it is cached: first its
// declared moves, into one KernelMoves value (domain/kernel_moves.h), then the kernel, which is
// handed those moves and runs them; it chooses no step and no transport. So no rule includes
// comm/, domain/ or kernels/, and every rule, moves included, can be checked in one process
// (tests/unit/rules_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "redistribute/steps.h"
#include "shardtensor/sharding_rule.h"
#include "spec/halo_geometry.h"

namespace shardtensor {

// The halo gathers of `plan` that cross shards, in order, and their adjoint scatter-adds.
std::vector<MoveStep> halo_gathers(const HaloPlan& plan);
std::vector<MoveStep> halo_scatter_adds(const HaloPlan& plan);
// A reduction over the groups of `mesh_dims` of `mesh`, one all-reduce per mesh dim of more
// than one rank (a one-rank group moves nothing).
std::vector<MoveStep> all_reduces_over(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims, ReduceOp reduce);
inline std::vector<MoveStep> sums_over(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims) {
  return all_reduces_over(mesh, mesh_dims, ReduceOp::Sum);
}

using PieceKernel = std::function<at::Tensor(const at::Tensor& piece)>;

class KernelMoves;  // domain/kernel_moves.h

// What lowering a plan's declared moves for this rank takes beyond the steps themselves.
struct MoveLowering {
  std::optional<DeviceMesh> mesh;  // whose groups the moves run on; none for a plan that declares none
  // Halo steps: every axis of the plan's halo, in order. Those whose windows cross shards are
  // the declared HaloGather and HaloScatterAdd steps; the others only assemble (or fold back)
  // the window locally.
  std::vector<HaloAxis> halo;
  double halo_fill = 0.0;  // a halo gather's value outside the field (max pooling's: -inf)
  // Ring steps: the batches of each declared phase as this rank runs them, and the longest
  // block's length (the same on every member), which sizes the transport. Called only on a
  // rank of the mesh.
  std::function<std::vector<RingBatch>(RingPhase)> ring_batches;
  int64_t widest_ring_rows = 0;
};

struct KernelPlan {
  virtual ~KernelPlan() = default;
  // The code that runs this plan on one rank, defined in src/kernels/: `moves` are moves()
  // lowered with move_lowering(), and the kernel moves bytes between ranks through them only.
  virtual LocalKernel lower(const KernelMoves& moves) const = 0;
  // The same kernel as a function of the first argument's local piece alone, where it needs
  // nothing else (a local reshape or squeeze; empty otherwise): the unboxed kernels
  // (dispatch/direct_kernel.h) call it without building an argument stack.
  virtual PieceKernel lower_for_piece() const { return {}; }
  // What the kernel computes, for explain and errors ("halo convolution (forward)").
  virtual std::string name() const = 0;
  // Every move between ranks the kernel makes, in order, in the vocabulary of redistribute plans
  // (redistribute/steps.h; none: a purely local kernel).
  virtual std::vector<MoveStep> moves() const { return {}; }
  // What lowering moves() takes (none: a plan that declares none).
  virtual MoveLowering move_lowering() const { return {}; }
  // How many keys of the counter-based generator one call draws, given the call's arguments
  // (tensors as None). A rank outside the mesh runs no kernel but draws as many, so that the
  // process's key stream stays in step with the ranks it shares other meshes with.
  virtual int64_t random_keys_drawn(c10::ArrayRef<c10::IValue> /*arguments*/) const { return 0; }
};

// A plan as a rule result holds it (plans are immutable once declared).
template <typename Plan>
std::shared_ptr<const KernelPlan> declare(Plan plan) {
  return std::make_shared<const Plan>(std::move(plan));
}

}  // namespace shardtensor
