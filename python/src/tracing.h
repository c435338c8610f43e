// What torch.compile's traceable wrapper (python/shardtensor/_traceable.py) needs to run
// shardtensor's dispatch on traced local pieces and to pass ShardTensors across a compiled
// graph's edges: a ShardTensor over a given piece and layout, the piece back, the guards' alias.
// Part of the Python extension, which alone uses it (C++ programs have no use for it), over the
// library's internal headers; the scope in which collectives are recorded instead of moving
// bytes is comm/traced_collectives.h's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "shardtensor/spec.h"

namespace shardtensor {

// A ShardTensor over `local` (this rank's piece: its shape must be spec's local shape here)
// with the layout `spec` and global strides `global_strides` (empty: contiguous). No
// communication and no autograd link: the wrapper calls it below autograd.
at::Tensor shard_tensor_over(const at::Tensor& local, const ShardTensorSpec& spec, std::vector<int64_t> global_strides = {});

// The piece a ShardTensor holds, as it is (to_local() is its differentiable form).
at::Tensor local_piece_of(const at::Tensor& t);

// The layout in which a compiled graph hands back the gradient of one input's piece: chosen when
// the graph's backward is traced (python/shardtensor/_traceable.py: into_graph), read by
// piece_into_graph's backward. Unset: gradient_layout of the input's layout.
struct GradientLayoutSlot {
  std::optional<ShardTensorSpec> layout;
};

// A ShardTensor as a compiled graph takes it: its piece, differentiably (to_local), whose
// gradient becomes a ShardTensor in the layout `slot` holds by then.
at::Tensor piece_into_graph(const at::Tensor& t, const std::shared_ptr<GradientLayoutSlot>& slot);

// A compiled graph's result, this rank's `piece`, as the ShardTensor of layout `spec` it stands
// for: no communication (the graph was traced for this layout on every rank), differentiable,
// its gradient moved to gradient_layout(spec) and handed back into the graph as a piece.
at::Tensor shard_tensor_out_of_graph(const at::Tensor& piece, const ShardTensorSpec& spec, std::vector<int64_t> global_strides);

// What torch.compile's guards compare a ShardTensor argument `t` by, for a graph traced for the
// layout `spec` and global strides `global_strides`: an alias of its piece that requires grad
// where `t` does, the same object on every call while the piece stays (the guards compare
// tensors by identity); undefined where `t` is not a ShardTensor of that layout (the guard
// fails: another graph).
at::Tensor guard_piece(const at::Tensor& t, const ShardTensorSpec& spec, c10::IntArrayRef global_strides);

}  // namespace shardtensor
