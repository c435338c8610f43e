// Moving a ShardTensor to another layout differentiably, and keeping a leaf's gradient in the
// leaf's own layout.
#pragma once

#include <ATen/core/Tensor.h>

#include "shardtensor/spec.h"
#include "shardtensor/transport_options.h"

namespace shardtensor {

// Differentiable move of a ShardTensor to `target` (same mesh, shape and dtype): its gradient
// goes back to the source's layout, with Partial made Replicate (gradient_layout).
// `options` (transport_options.h) choose the transports of both moves.
at::Tensor move_to(const at::Tensor& t, const ShardTensorSpec& target, const TransportOptions& options = {});

// The layout of the gradient of a tensor laid out as `spec`: Partial becomes Replicate (the
// gradient of a pending reduction reaches every term whole), everything else stays.
ShardTensorSpec gradient_layout(const ShardTensorSpec& spec);

// Makes the gradients that reach leaf ShardTensor `leaf` arrive in its layout: sharded where
// the leaf is sharded, with the leaf's shard sizes. Backward formulas build gradients from
// whatever their cotangents are (sum's and mean's broadcast a Replicate cotangent to the
// input's shape), so without this a sharded parameter could get a whole Replicate gradient on
// every rank. Where the leaf is Replicate a Partial gradient stays Partial (its reduction
// waits for a reader, as DTensor's does); a Partial leaf's gradient is left as it comes
// (to_local's backward gives it the leaf's Partial placements, DTensor's rule). Idempotent;
// the kernel calls it for each leaf input that requires grad.
void keep_leaf_gradient_layout(const at::Tensor& leaf);

}  // namespace shardtensor
