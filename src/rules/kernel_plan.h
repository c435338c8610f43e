// How a built-in rule asks for local compute beyond calling the operator on the local pieces.
//
// Rules stay pure: they see metadata and return layouts. When an op needs more than that (a
// halo window gathered before the local convolution, a mean divided by the global count,
// statistics summed over the shards of a norm), the rule returns a KernelPlan: a const
// description of that computation and of every move it makes between ranks (moves()). The
// code that runs a plan lives in src/kernels/, one file per family, which defines the plan's
// lower(); dispatch lowers a plan once, when the propagation that made it is cached. So no
// rule includes comm/, domain/ or kernels/, and every rule, moves included, can be checked in
// one process (tests/unit/rules_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/sharding_rule.h"
#include "spec/halo_geometry.h"

namespace shardtensor {

// One transfer between ranks that a kernel makes in the middle of its op.
struct DeclaredMove {
  // RingPass: blocks of `tensor_dim` passed from each rank to the next along the mesh dim, one
  // message batch per step (attention); RingGradientPass: the blocks' gradient accumulators
  // passed behind them, one batch per step after the block's compute (attention's backward);
  // RingReturn: the gradients of the blocks sent back to the ranks that own them. AllGather: a
  // small statistic gathered mid-op (attention's per-row log-sum-exp over split keys).
  enum class Kind { HaloGather, HaloScatterAdd, AllReduce, AllGather, RingPass, RingGradientPass, RingReturn };
  Kind kind = Kind::AllReduce;
  int64_t mesh_dim = -1;    // the group it runs on
  int64_t tensor_dim = -1;  // halo moves: the tensor dim whose windows move
  ReduceOp reduce = ReduceOp::Sum;  // all-reduces: how the pieces combine
  // How many collectives (or message batches) it takes: one, but for the ring's, which take
  // one batch per ring step that moves a block.
  int64_t batches = 1;
  // A backward's window gather that the kernel skips where its forward kept the rows it
  // received (kernels/window_cache.h: one split axis, grad mode on during the forward).
  bool skipped_where_kept = false;

  std::string to_string() const;  // "halo gather of dim 2 over mesh dim 0", "all-reduce(max) over mesh dim 1"
  // What CommDebugMode counts each of its batches as, whichever transport carries it.
  const char* counted_as() const { return counted_as_of(kind); }
  bool operator==(const DeclaredMove& o) const {
    return kind == o.kind && mesh_dim == o.mesh_dim && tensor_dim == o.tensor_dim && reduce == o.reduce && batches == o.batches &&
           skipped_where_kept == o.skipped_where_kept;
  }

  // "all_to_all" for a halo exchange, "all_reduce", "all_gather", and the ring's batches
  // "ring_send_recv", "ring_gradients" and "ring_return": the name the kernel gives its batches.
  static const char* counted_as_of(Kind kind);
};

// The halo gathers of `plan` that cross shards, in order, and their adjoint scatter-adds.
std::vector<DeclaredMove> halo_gathers(const HaloPlan& plan);
std::vector<DeclaredMove> halo_scatter_adds(const HaloPlan& plan);
// A reduction over the groups of `mesh_dims` of `mesh`, one all-reduce per mesh dim of more
// than one rank (a one-rank group moves nothing).
std::vector<DeclaredMove> all_reduces_over(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims, ReduceOp reduce);
inline std::vector<DeclaredMove> sums_over(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims) {
  return all_reduces_over(mesh, mesh_dims, ReduceOp::Sum);
}

using PieceKernel = std::function<at::Tensor(const at::Tensor& piece)>;

struct KernelPlan {
  virtual ~KernelPlan() = default;
  // The code that runs this plan on one rank: defined in src/kernels/.
  virtual LocalKernel lower() const = 0;
  // The same kernel as a function of the first argument's local piece alone, where it needs
  // nothing else (a local reshape or squeeze; empty otherwise): the unboxed kernels
  // (dispatch/direct_kernel.h) call it without building an argument stack.
  virtual PieceKernel lower_for_piece() const { return {}; }
  // What the kernel computes, for explain and errors ("halo convolution (forward)").
  virtual std::string name() const = 0;
  // Every move between ranks the kernel makes, in order (none: a purely local kernel).
  virtual std::vector<DeclaredMove> moves() const { return {}; }
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
