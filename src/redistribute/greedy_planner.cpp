// The greedy planner, DTensor-style: resolve Partials, undo every split that is not already
// where the target wants it (innermost first), then chunk the new splits (outermost first).
//
// Nesting is the trap: with (S(0), S(0)) -> (R, S(0)), mesh dim 1 holds S(0) in both layouts,
// but nested under mesh dim 0 in the source and alone in the target, so it must be undone too.
// A split is "kept" only when the target has it on the same mesh dim with the same outer splits,
// all themselves kept; everything else is gathered away and re-chunked.
#include <c10/util/Exception.h>

#include "redistribute/moves.h"

namespace shardtensor::planning {
namespace {

class Greedy {
 public:
  explicit Greedy(const Problem& problem) : problem_(problem), codes_(problem.source()), target_(problem.target()) {}

  std::vector<MoveStep> run() {
    resolve_partials();
    undo_splits_not_kept();
    chunk_missing_splits();
    return std::move(moves_);
  }

 private:
  uint8_t now(int64_t m) const { return code_at(codes_, m); }
  uint8_t wanted(int64_t m) const { return code_at(target_, m); }
  void take(const MoveStep& move) {
    moves_.push_back(move);
    codes_ = problem_.apply(codes_, move);
  }

  std::vector<bool> kept_splits() const {
    std::vector<bool> kept(problem_.mesh_ndim(), false);
    for (int64_t m = 0; m < problem_.mesh_ndim(); ++m) {
      if (!is_shard_code(now(m)) || now(m) != wanted(m)) continue;
      bool outer_kept = true;
      for (int64_t outer = 0; outer < m; ++outer)
        if (now(outer) == now(m) || wanted(outer) == now(m)) outer_kept = outer_kept && kept[outer];
      kept[m] = outer_kept;
    }
    return kept;
  }

  // Whether mesh dim m can start sharding `tensor_dim` now and end up as the target has it:
  // innermost, under exactly the target's outer splits, all of them kept.
  bool lands_as_target(const std::vector<bool>& kept, int64_t m, int64_t tensor_dim) const {
    if (!problem_.may_shard(codes_, m, tensor_dim)) return false;
    for (int64_t outer = 0; outer < m; ++outer) {
      const bool split_now = now(outer) == shard_code(tensor_dim), split_wanted = wanted(outer) == shard_code(tensor_dim);
      if (split_now != split_wanted || (split_now && !kept[outer])) return false;
    }
    return true;
  }

  void resolve_partials() {
    for (int64_t m = 0; m < problem_.mesh_ndim(); ++m) {
      if (now(m) != kPartial || wanted(m) == kPartial) continue;
      if (is_shard_code(wanted(m)) && lands_as_target(kept_splits(), m, shard_dim_of(wanted(m)))) {
        take(ReduceScatterStep{m, problem_.partial_op(m), shard_dim_of(wanted(m))});
      } else {
        take(AllReduceStep{m, problem_.partial_op(m)});
      }
    }
  }

  // Inner to outer, so that every split undone is the innermost of its tensor dim: a split
  // nested inside one that is not kept is not kept either, and went first.
  void undo_splits_not_kept() {
    const std::vector<bool> kept = kept_splits();
    for (int64_t m = problem_.mesh_ndim() - 1; m >= 0; --m) {
      if (!is_shard_code(now(m)) || kept[m]) continue;
      TORCH_INTERNAL_ASSERT(problem_.may_shard(codes_, m, shard_dim_of(now(m))), "greedy planner: undoing an outer split");
      if (is_shard_code(wanted(m)) && lands_as_target(kept, m, shard_dim_of(wanted(m)))) {
        take(AllToAllStep{m, shard_dim_of(now(m)), shard_dim_of(wanted(m))});
      } else {
        take(AllGatherStep{m, shard_dim_of(now(m))});
      }
    }
  }

  // Outer to inner, so that every new split is the innermost of its tensor dim.
  void chunk_missing_splits() {
    for (int64_t m = 0; m < problem_.mesh_ndim(); ++m) {
      if (now(m) == wanted(m)) continue;
      const int64_t d = shard_dim_of(wanted(m));
      TORCH_INTERNAL_ASSERT(now(m) == kReplicate && is_shard_code(wanted(m)) && problem_.may_shard(codes_, m, d),
                            "greedy planner: mesh dim ", m, " is not ready to be chunked");
      take(LocalChunkStep{m, d});
    }
  }

  const Problem& problem_;
  Codes codes_;
  const Codes target_;
  std::vector<MoveStep> moves_;
};

}  // namespace

std::vector<MoveStep> greedy_moves(const Problem& problem) { return Greedy(problem).run(); }

}  // namespace shardtensor::planning
