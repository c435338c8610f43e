// Every move between ranks, in one vocabulary: MoveStep.
//
// A redistribute plan is a chain of steps (plan.h), and so is what a kernel moves in the middle
// of its op (rules/kernel_plan.h: KernelPlan::moves()). Both are MoveSteps, so explain prints
// them alike, CommDebugMode names them alike, and a mid-op reduction is the very AllReduceStep a
// Partial's redistribute runs (executor.h: reduce_in_place).
//
// Redistribute steps change the placement of ONE mesh dim and run as one collective over that
// mesh dim's group (but Exchange, over the whole mesh):
//   Partial(op) -> Replicate   AllReduce(m)
//   Partial(op) -> Shard(d)    ReduceScatter(m, d)
//   Shard(d)    -> Replicate   AllGather(m)
//   Shard(d)    -> Shard(d')   AllToAll(m, d -> d')
//   Replicate   -> Shard(d)    LocalChunk(m, d)      (no communication)
//   Exchange                   any Shard/Replicate layout -> the target, in one all-to-all over
//                              the mesh (boxes.h); it also rebalances shard sizes.
// Kernel steps move what a kernel needs beyond its local pieces:
//   HaloGather(m, d)           the window of dim d each rank needs from its neighbours (domain/kernel_moves.h)
//   HaloScatterAdd(m, d)       its adjoint: window pieces sent back to their owners and added
//   Ring(phase, m, d)          attention's blocks passed around the ring, one batch per step
//   StatisticsGather(m)        per-row statistics stacked over the group (attention's merge)
//   AllReduce(m, op)           a statistic reduced mid-op (norms, global means, checks)
// Pure metadata: no tensor, no communicator; rules include it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "shardtensor/placement.h"

namespace shardtensor {

struct AllReduceStep {
  int64_t mesh_dim;
  ReduceOp op;
};
struct ReduceScatterStep {
  int64_t mesh_dim;
  ReduceOp op;
  int64_t tensor_dim;
};
struct AllGatherStep {
  int64_t mesh_dim;
  int64_t tensor_dim;  // the dim it stops sharding
};
struct AllToAllStep {
  int64_t mesh_dim;
  int64_t from_dim, to_dim;
};
struct LocalChunkStep {
  int64_t mesh_dim;
  int64_t tensor_dim;
};
struct ExchangeStep {};

struct HaloGatherStep {
  int64_t mesh_dim;
  int64_t tensor_dim;  // the dim whose windows move
  // A backward's window gather that the kernel skips where its forward kept the rows it
  // received (kernels/window_cache.h: one split axis, grad mode on during the forward).
  bool skipped_where_kept = false;
};
struct HaloScatterAddStep {
  int64_t mesh_dim;
  int64_t tensor_dim;
};
// Pass: blocks passed from each rank to the next, one batch per ring step (attention's forward
// and backward); GradientPass: the blocks' gradient accumulators passed behind them, one batch
// per step after the block's compute; Return: the blocks' gradients sent back to their owners.
enum class RingPhase : uint8_t { Pass, GradientPass, Return };
struct RingStep {
  RingPhase phase;
  int64_t mesh_dim;
  int64_t tensor_dim;  // the dim the blocks are cut from
  int64_t batches = 1;  // one per ring step that moves a block
};
// One block of a ring batch as this rank moves it: to or from group rank `peer`, the block that
// group rank `block` owns, `rows` long along the ring step's tensor dim.
struct RingTransfer {
  int64_t peer;
  int64_t block;
  int64_t rows;
};
// One batch of a ring step (RingStep::batches of them), as this rank runs it: the blocks it
// sends and those it receives, in the order both sides list them. Pure data, computed from the
// kernel's plan once, when its moves are lowered (kernels/attention_blocks.h: ring_batches).
struct RingBatch {
  std::vector<RingTransfer> sends, receives;
};

struct StatisticsGatherStep {
  int64_t mesh_dim;
};

using MoveStep = std::variant<AllReduceStep, ReduceScatterStep, AllGatherStep, AllToAllStep, LocalChunkStep, ExchangeStep,
                              HaloGatherStep, HaloScatterAddStep, RingStep, StatisticsGatherStep>;

// "AllGather(mesh_dim=1, tensor_dim=0)", "HaloGather(mesh_dim=0, tensor_dim=2)",
// "AllReduce(mesh_dim=1, max)", "RingPass(mesh_dim=0, tensor_dim=2, batches=3)".
std::string to_string(const MoveStep& step);
// What CommDebugMode counts the step's batches as, whichever transport carries them: a gather
// "all_gather", a reduce-scatter "reduce_scatter" (as DTensor's), a halo exchange "all_to_all",
// the ring's "ring_send_recv", "ring_gradients" and "ring_return".
const char* counted_as(const MoveStep& step);
const char* counted_as(RingPhase phase);
// How many collectives (or message batches) the step takes: one, but for the ring's.
int64_t batches_of(const MoveStep& step);
// The mesh dim whose group the step runs on; -1 for Exchange (the whole mesh).
int64_t mesh_dim_of(const MoveStep& step);
// The tensor dim a redistribute step starts sharding (ReduceScatter, AllToAll, LocalChunk).
std::optional<int64_t> starts_sharding(const MoveStep& step);
// Whether the step is one a redistribute plan holds (AllReduce to Exchange), which the executor
// runs from the two layouts around it.
bool is_redistribute_step(const MoveStep& step);
// Whether the step is a halo gather or its adjoint (explain names their transport).
bool is_halo_step(const MoveStep& step);

}  // namespace shardtensor
