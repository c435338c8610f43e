// Load-balanced causal attention on a split sequence: the "zigzag" (head-tail) layout.
//
// Under a causal mask the rows late in the sequence see many keys and the early rows few, so
// with contiguous shards the last rank computes about 2n - 1 times as much as the first. The
// zigzag layout cuts the sequence into 2n chunks and gives rank r chunks r and 2n - 1 - r: every
// rank then holds one early and one late chunk, and computes about the same.
//
//   q = shardtensor::zigzag_shard(q, /*mesh_dim=*/0, /*seq_dim=*/2);    // also k, v, targets...
//   { shardtensor::ZigzagCausal scope(mesh, 0);                         // attention reads it so
//     out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
//     loss.backward(); }                                                // inside the scope too
//   out = shardtensor::zigzag_unshard(out, 0, 2);                       // back in order
//
// A zigzag tensor is an ordinary ShardTensor, Shard(seq_dim) along mesh_dim with the sizes
// zigzag_shard_sizes gives, whose global tensor is the sequence in permuted order: rank 0's
// chunks first, then rank 1's. Every operator that treats positions alike (pointwise, linear,
// layer norm, a loss summed or averaged over positions) computes on it as on any tensor.
// Causal attention is the one place positions matter: while the setting is on for a mesh dim,
// scaled dot-product attention whose sequence is split along it reads its shards as zigzag
// chunks and masks by the original positions. The setting is process-wide, as DTensor's
// context_parallel load balancing is, because autograd's backward must see the same one (on a
// CUDA device it runs on another thread): keep it on until the backward pass has run.
// An explicit attn_mask is not supported under it (it raises, naming the setting).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "shardtensor/device_mesh.h"

namespace shardtensor {

// The 2n chunk lengths of a sequence of `length` split over `ranks` ranks: as even as possible,
// the longer chunks first. Any length works, including fewer positions than chunks (empty
// chunks, so empty shards).
std::vector<int64_t> zigzag_chunk_lengths(int64_t length, int64_t ranks);
// Rank r's shard size: chunk r plus chunk 2n - 1 - r.
std::vector<int64_t> zigzag_shard_sizes(int64_t length, int64_t ranks);

// `t` (a ShardTensor in any layout whose `seq_dim` is split by no other mesh dim) laid out as
// zigzag chunks along `mesh_dim`. Where `t` is replicated along mesh_dim each rank cuts its
// chunks out, and nothing moves; otherwise the sequence is first split in order along
// mesh_dim (a redistribute), then each rank receives the pieces of its two chunks from their
// holders, in one message batch. The other mesh dims keep their placements. Differentiable.
at::Tensor zigzag_shard(const at::Tensor& t, int64_t mesh_dim, int64_t seq_dim);

// The inverse: `t` must be laid out by zigzag_shard (sizes included). The result holds the
// sequence in its original order, Shard(seq_dim) along mesh_dim with torch.chunk sizes.
// Differentiable.
at::Tensor zigzag_unshard(const at::Tensor& t, int64_t mesh_dim, int64_t seq_dim);

// Whether causal attention reads sequence shards along `mesh_dim` of `mesh` as zigzag chunks
// (see above). Off by default. Every rank must set the same; cached propagations are dropped.
void set_zigzag_causal(const DeviceMesh& mesh, int64_t mesh_dim, bool on);
bool zigzag_causal(const DeviceMesh& mesh, int64_t mesh_dim);

// set_zigzag_causal(mesh, mesh_dim, true) for the lifetime of the scope; the previous setting
// comes back after.
class ZigzagCausal {
 public:
  ZigzagCausal(const DeviceMesh& mesh, int64_t mesh_dim);
  ~ZigzagCausal();
  ZigzagCausal(const ZigzagCausal&) = delete;
  ZigzagCausal& operator=(const ZigzagCausal&) = delete;

 private:
  DeviceMesh mesh_;
  int64_t mesh_dim_;
  bool previous_;
};

}  // namespace shardtensor
