// zigzag_shard and zigzag_unshard (shardtensor/context_parallel.h): redistributes to and from
// ZigzagShard(seq_dim) along one mesh dim. The exchange between the two orders is the planner's
// (redistribute/planner.cpp), so these only check their arguments and name the layout.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>

#include "api/conversions.h"
#include "dispatch/relayout.h"
#include "shardtensor/context_parallel.h"
#include "redistribute/plan.h"
#include "shardtensor/shard_tensor.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// `t`'s layout with mesh dim `mesh_dim` placed as `placement` on the sequence (dim `seq_dim`,
// which may count from the end), after checking the arguments (alike on every rank: they read
// the spec only).
ShardTensorSpec with_sequence(const char* api, const ShardTensorSpec& s, int64_t mesh_dim, int64_t seq_dim, bool zigzag) {
  const DeviceMesh& mesh = s.mesh();
  TORCH_CHECK_VALUE(mesh_dim >= 0 && mesh_dim < mesh.ndim(), api, ": mesh_dim ", mesh_dim, " is not a dim of ", mesh, " (0 to ",
                    mesh.ndim() - 1, ").");
  TORCH_CHECK_VALUE(seq_dim >= -s.ndim() && seq_dim < s.ndim(), api, ": seq_dim ", seq_dim, " is not a dim of the ", s.ndim(),
                    "-d tensor ", s, ".");
  if (seq_dim < 0) seq_dim += s.ndim();
  for (int64_t m = 0; m < mesh.ndim(); ++m)
    TORCH_CHECK_VALUE(m == mesh_dim || !s.placements()[m].is_shard(seq_dim), api, ": mesh dim ", m, " also splits the sequence (dim ",
                      seq_dim, ") of ", s, "; only mesh dim ", mesh_dim, " may. Redistribute that mesh dim first.");
  Placements ps = s.placements();
  ps[mesh_dim] = zigzag ? ZigzagShard(seq_dim) : Shard(seq_dim);
  return redistribute_target(s, ps, nullptr);
}

}  // namespace

at::Tensor zigzag_shard(const at::Tensor& t, int64_t mesh_dim, int64_t seq_dim) {
  return move_to(t, with_sequence("zigzag_shard", spec(t), mesh_dim, seq_dim, /*zigzag=*/true));
}

at::Tensor zigzag_unshard(const at::Tensor& t, int64_t mesh_dim, int64_t seq_dim) {
  const ShardTensorSpec& s = spec(t);
  const ShardTensorSpec target = with_sequence("zigzag_unshard", s, mesh_dim, seq_dim, /*zigzag=*/false);
  const Placement& held = s.placements()[mesh_dim];
  TORCH_CHECK_VALUE(held.is_zigzag() && target.placements()[mesh_dim].is_shard(held.tensor_dim), "zigzag_unshard: expects the sequence (dim ",
                    seq_dim, ") split in zigzag order along mesh dim ", mesh_dim, " (", to_string(ZigzagShard(target.placements()[mesh_dim].tensor_dim)),
                    ", as zigzag_shard lays it out); got ", s, ".");
  return move_to(t, target);
}

}  // namespace shardtensor
