// The plans of the view rules (rules/views.cpp declares them, kernels/views.cpp runs them):
// operators whose size arguments are global run locally with those sizes rewritten to the
// local piece's.
#pragma once

#include <optional>

#include "rules/kernel_plan.h"

namespace shardtensor {

// out_local[out_dim] = in_local[in_dim] * num / den for the listed dims of an int[] argument;
// other entries stay as given.
struct SizeFromInput {
  int64_t out_dim, in_dim, num = 1, den = 1;
};

// The operator itself, its int[] argument `size_arg` rewritten from the local shape of tensor
// argument `in_arg` (expand, select_backward, slice_backward...).
// With `stride_arg`, that int[] argument becomes the contiguous strides of the rewritten sizes
// (new_empty_strided given the contiguous strides of its global size).
struct LocalSizesPlan : KernelPlan {
  size_t size_arg = 0;
  size_t in_arg = 0;
  std::vector<SizeFromInput> rewrites;
  std::optional<size_t> stride_arg;

  LocalSizesPlan(size_t size, size_t in, std::vector<SizeFromInput> r, std::optional<size_t> stride = std::nullopt)
      : size_arg(size), in_arg(in), rewrites(std::move(r)), stride_arg(stride) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "the operator on local sizes"; }
};

// view / _unsafe_view / _reshape_alias as a local reshape of the first argument to `shape`,
// with the sharded dims' sizes rewritten to the local piece's. Locally a reshape, not a view:
// the wrapper reports contiguous strides on every rank (see ShardTensorImpl), so the local
// piece of a "contiguous" wrapper may be a transposed view. reshape keeps aliasing whenever
// the piece is viewable, and copies only when it is not.
struct LocalReshapePlan : KernelPlan {
  std::vector<int64_t> shape;  // the global output shape
  std::vector<SizeFromInput> rewrites;
  int64_t num_args = 0;  // the operator's argument count

  LocalKernel lower(const KernelMoves& moves) const override;
  PieceKernel lower_for_piece() const override;
  std::string name() const override { return "local reshape"; }
};

// squeeze of exactly the globally dropped dims (ascending): a sharded dim whose piece happens
// to have size 1 on this rank must stay.
struct SqueezePlan : KernelPlan {
  std::vector<int64_t> dropped;
  int64_t num_args = 0;  // the operator's argument count

  LocalKernel lower(const KernelMoves& moves) const override;
  PieceKernel lower_for_piece() const override;
  std::string name() const override { return "squeeze of the global size-1 dims"; }
};

}  // namespace shardtensor
