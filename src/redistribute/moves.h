// What both planners search over: a layout reduced to its placements, the moves between such
// layouts (the one-mesh-dim MoveSteps of steps.h, plus Exchange straight to the target), and
// what a move costs. Shard sizes play no part here; they are chosen when a chain of moves becomes a
// plan (planner.cpp), which appends an Exchange when the sizes still differ at the end.
//
// Cost model, in bytes received by the busiest rank plus a latency charge per collective:
//   AllReduce      2 (n-1)/n L      (ring)             L: the bytes a rank holds before the move
//   ReduceScatter    (n-1)/n L                          n: the size of the move's mesh dim
//   AllGather        (n-1)   L
//   AllToAll         (n-1)/n L
//   LocalChunk     a local copy of the new piece, at a twentieth of a wire byte
//   Exchange       max over ranks of |target box| - |target box ∩ held box|, with boxes
//                  computed from even splits
// Collectives on a mesh dim of size 1 are local copies and cost like LocalChunk.
#pragma once

#include <cstdint>
#include <vector>

#include "redistribute/steps.h"
#include "shardtensor/spec.h"

namespace shardtensor::planning {

constexpr double kLatencyBytes = 256 * 1024;  // one collective's latency, as bytes on the wire
constexpr double kLocalCopyFactor = 0.05;     // a local copy's byte, as a fraction of a wire byte

// One byte per mesh dim: kReplicate, shard_code(d), or kPartial (the source's Partial op on that
// dim: Partial only ever disappears, so the op is known).
using Codes = uint64_t;
constexpr int kMaxMeshDims = 8;
constexpr uint8_t kReplicate = 0, kPartial = 0xFF;
inline uint8_t shard_code(int64_t tensor_dim) { return static_cast<uint8_t>(1 + tensor_dim); }
inline bool is_shard_code(uint8_t c) { return c != kReplicate && c != kPartial; }
inline int64_t shard_dim_of(uint8_t c) { return c - 1; }
inline uint8_t code_at(Codes codes, int64_t mesh_dim) { return static_cast<uint8_t>(codes >> (8 * mesh_dim)); }
inline Codes with_code(Codes codes, int64_t mesh_dim, uint8_t c) {
  const int shift = 8 * static_cast<int>(mesh_dim);
  return (codes & ~(Codes{0xFF} << shift)) | (Codes{c} << shift);
}


class Problem {
 public:
  Problem(const ShardTensorSpec& source, const ShardTensorSpec& target);

  Codes source() const { return source_codes_; }
  Codes target() const { return target_codes_; }
  int64_t mesh_ndim() const { return static_cast<int64_t>(mesh_shape_.size()); }

  // Whether `mesh_dim` may start sharding `tensor_dim` in `codes`: no later mesh dim shards it,
  // so the new split is the innermost one.
  bool may_shard(Codes codes, int64_t mesh_dim, int64_t tensor_dim) const;
  // Whether a Partial still in `codes` must go before an Exchange (the target does not keep it).
  bool has_pending_partial(Codes codes) const;
  // The source's reduce op on `mesh_dim`, where it is Partial (a Partial only ever disappears).
  ReduceOp partial_op(int64_t mesh_dim) const { return partial_ops_[mesh_dim]; }

  // Every move out of `from`, as visit(move, next_codes).
  template <class Visit>
  void for_each_move(Codes from, Visit&& visit) const;

  Codes apply(Codes from, const MoveStep& move) const;
  double cost(Codes from, const MoveStep& move) const;

 private:
  double held_bytes(Codes codes) const;
  double exchange_bytes(Codes from) const;

  std::vector<int64_t> mesh_shape_;
  std::vector<ReduceOp> partial_ops_;  // per mesh dim: the source's op where it is Partial
  std::vector<int64_t> coordinates_;  // every mesh coordinate, row-major, flattened
  int64_t tensor_ndim_;
  double total_bytes_;
  Codes source_codes_, target_codes_;
};

template <class Visit>
void Problem::for_each_move(Codes from, Visit&& visit) const {
  for (int64_t m = 0; m < mesh_ndim(); ++m) {
    const uint8_t c = code_at(from, m);
    if (c == kPartial) {
      if (code_at(target_codes_, m) == kPartial) continue;  // kept to the end
      visit(AllReduceStep{m, partial_op(m)}, with_code(from, m, kReplicate));
      for (int64_t d = 0; d < tensor_ndim_; ++d)
        if (may_shard(from, m, d)) visit(ReduceScatterStep{m, partial_op(m), d}, with_code(from, m, shard_code(d)));
    } else if (c == kReplicate) {
      for (int64_t d = 0; d < tensor_ndim_; ++d)
        if (may_shard(from, m, d)) visit(LocalChunkStep{m, d}, with_code(from, m, shard_code(d)));
    } else if (may_shard(from, m, shard_dim_of(c))) {  // only the innermost split may go
      visit(AllGatherStep{m, shard_dim_of(c)}, with_code(from, m, kReplicate));
      for (int64_t d = 0; d < tensor_ndim_; ++d)
        if (d != shard_dim_of(c) && may_shard(from, m, d)) visit(AllToAllStep{m, shard_dim_of(c), d}, with_code(from, m, shard_code(d)));
    }
  }
  if (from != target_codes_ && !has_pending_partial(from)) visit(ExchangeStep{}, target_codes_);
}

// The two planners: chains of moves from problem.source() to problem.target().
std::vector<MoveStep> greedy_moves(const Problem& problem);
std::vector<MoveStep> searched_moves(const Problem& problem);

}  // namespace shardtensor::planning
