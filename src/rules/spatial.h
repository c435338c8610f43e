// What the spatial rule families (convolution, pooling, resampling, padding, spatial
// normalisation) share: which layouts they run on, and the geometry of their windows.
//
// Layout: tensors are [batch..., channel, spatial...]. Batch dims keep any sharding; the
// channel dim must be whole where an op mixes channels; a spatial dim may be sharded by one
// mesh dim (a dim split by two nested mesh dims is gathered first); Partial is resolved.
//
// Geometry: along a sharded spatial dim, a sliding-window op (kernel extent e, stride s, left
// padding p) gives rank r the outputs whose windows start in its shard, [ceil(a_r/s),
// ceil(b_r/s)), so output shard sizes follow the input's and most of each window is local;
// the window of outputs [A, B) is [A*s - p, (B-1)*s - p + e). Everything here is computed
// from specs on every rank alike, so every rank plans the same exchanges.
#pragma once

#include "rules/helpers.h"
#include "rules/kernel_plan.h"
#include "spec/halo_geometry.h"

namespace shardtensor {

// `spec` made runnable by a spatial op with `num_spatial` trailing spatial dims: Partial
// resolved, the channel dim (just before the spatial ones) whole when `channel_whole`, and
// any spatial dim split by more than one mesh dim gathered.
ShardTensorSpec spatial_layout(const ShardTensorSpec& spec, int64_t num_spatial, bool channel_whole);

// The spatial dims of `spec` (the trailing `num_spatial`) that are sharded.
std::vector<int64_t> sharded_spatial_dims(const ShardTensorSpec& spec, int64_t num_spatial);

// Per-coordinate owned ranges of `tensor_dim` (one range [0, length) when not sharded).
std::vector<Range> owned_ranges(const ShardTensorSpec& spec, int64_t tensor_dim);
// The mesh dim sharding `tensor_dim`, or -1.
int64_t sharding_mesh_dim(const ShardTensorSpec& spec, int64_t tensor_dim);

// A sliding window along one dim.
struct SlidingWindow {
  int64_t extent = 1;   // dilation * (kernel - 1) + 1
  int64_t stride = 1;
  int64_t pad = 0;      // left padding
  int64_t out_length = 0;
};

// Output ranges per rank of a sliding window over input shards `owned` (see the header).
std::vector<Range> sliding_outputs(const std::vector<Range>& owned, const SlidingWindow& w);
// The input window that output range `out` reads (empty for an empty range).
Range sliding_input_window(Range out, const SlidingWindow& w);
// The halo axis of input dim `tensor_dim` for a sliding window.
HaloAxis sliding_axis(const ShardTensorSpec& in, int64_t tensor_dim, const SlidingWindow& w);

// `layout` with the shard sizes of `tensor_dim` replaced (output sizes derived per dim).
OutputLayout with_output_sizes(OutputLayout layout, int64_t tensor_dim, const std::vector<Range>& ranges);

// `spec` (a gradient, or any operand shaped like an op's output) laid out as `layout`.
ShardTensorSpec laid_out(const ShardTensorSpec& spec, const OutputLayout& layout);

// The input targets of a normalisation's backward (native_layer_norm_backward in
// normalization.cpp, native_group_norm_backward in spatial_norm.cpp), routed by argument name:
// grad_out aligned with `in` (the input's target), input as `in`, mean and rstd laid out as
// `stats`, and the parameters (weight, bias) as `parameter_target` makes them.
std::vector<ShardTensorSpec> norm_backward_targets(const OpMeta& op, const ShardTensorSpec& in, const OutputLayout& stats,
                                                   const std::function<ShardTensorSpec(const ShardTensorSpec&)>& parameter_target);

// How an output's dims follow the first input's, for empty_safe: all of them ([N, C, *]
// outputs), only the leading batch dim ([N, G] statistics), or none (per-channel sums).
enum class Follows { AllDims, BatchDim, Nothing };

// A kernel that runs `inner` (none: the operator itself) on this rank's pieces; when the
// first tensor argument is empty, on stand-ins whose empty dims have size 1, and the outputs
// are narrowed back along the dims they share with it (`follows`, one entry per output; none
// given: every output follows all dims). libtorch's spatial kernels refuse a zero channel
// count, and its CPU batch norm divides by zero on an empty piece; uneven splits give ranks
// such pieces. Lowered in kernels/empty_safe.cpp.
struct EmptySafePlan : KernelPlan {
  std::shared_ptr<const KernelPlan> inner;
  std::vector<Follows> follows;

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return inner ? inner->name() + ", safe on empty pieces" : "the operator, safe on empty pieces"; }
  std::vector<MoveStep> moves() const override { return inner ? inner->moves() : std::vector<MoveStep>{}; }
  MoveLowering move_lowering() const override { return inner ? inner->move_lowering() : MoveLowering{}; }
};

std::shared_ptr<const KernelPlan> empty_safe(std::shared_ptr<const KernelPlan> inner = {}, std::vector<Follows> follows = {});

// The int[k] argument `name` broadcast to `k` values (pooling accepts one value for every
// dim); `if_empty` stands for an empty list. By name only, like the readers in helpers.h.
std::vector<int64_t> expand_param(const OpMeta& op, const std::string& name, int64_t k, std::vector<int64_t> if_empty);
std::vector<int64_t> expand_param(const OpMeta&, size_t, int64_t, std::vector<int64_t>) = delete;

}  // namespace shardtensor
