// Load-balanced causal attention on a split sequence: the "zigzag" (head-tail) layout.
//
// Under a causal mask the rows late in the sequence see many keys and the early rows few, so
// with contiguous shards the last rank computes about 2n - 1 times as much as the first. The
// zigzag layout cuts the sequence into 2n chunks and gives rank r chunks r and 2n - 1 - r: every
// rank then holds one early and one late chunk, and computes about the same.
//
//   q = shardtensor::zigzag_shard(q, /*mesh_dim=*/0, /*seq_dim=*/2);    // also k, v, targets...
//   out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
//   out = shardtensor::zigzag_unshard(out, 0, 2);                       // back in order
//
// A zigzag tensor is a ShardTensor whose sequence dim is ZigzagShard(seq_dim) along mesh_dim
// (placement.h): the order is part of its layout, so causal attention reads it from q, k and v,
// with no setting to keep on until the backward has run. Its global tensor is the sequence in
// order: full_tensor() and every redistribute give the positions where one process has them, a
// replicated operand (a positional buffer) meets it position by position, and every operator
// computes the one-process result. Operators whose rules carry the order keep it (pointwise,
// reductions, matmuls and linear, layer norm, softmax, losses, views, slices, splits, joins,
// attention; rules/registry.h: carry_order); any other operator gets its zigzag inputs back in
// order first (one exchange, with a one-time warning; an error in strict mode).
// redistribute(t, {ZigzagShard(2)}) makes the same layout as zigzag_shard.
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

// `t` (a ShardTensor in any layout whose `seq_dim` is split by no other mesh dim) with its
// sequence as ZigzagShard(seq_dim) along `mesh_dim`, the other mesh dims as they were: a
// redistribute. Where `t` is replicated along mesh_dim each rank cuts its chunks out and nothing
// moves; otherwise each rank receives the stretches of its two chunks from their holders in one
// exchange. Differentiable.
at::Tensor zigzag_shard(const at::Tensor& t, int64_t mesh_dim, int64_t seq_dim);

// The inverse: `t`'s sequence must be ZigzagShard(seq_dim) along mesh_dim. The result holds it
// Shard(seq_dim) in torch.chunk sizes. Differentiable.
at::Tensor zigzag_unshard(const at::Tensor& t, int64_t mesh_dim, int64_t seq_dim);

}  // namespace shardtensor
