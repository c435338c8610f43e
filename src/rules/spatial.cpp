#include "rules/spatial.h"

#include <c10/util/Exception.h>

namespace shardtensor {

ShardTensorSpec spatial_layout(const ShardTensorSpec& spec, int64_t num_spatial, bool channel_whole) {
  std::vector<int64_t> gathered;
  const int64_t first_spatial = spec.ndim() - num_spatial;
  if (channel_whole && first_spatial >= 1) gathered.push_back(first_spatial - 1);
  for (const DimSharding& s : spec.shardings())
    if (s.tensor_dim >= first_spatial && s.mesh_dims.size() > 1) gathered.push_back(s.tensor_dim);
  return replicate_tensor_dims(without_partial(spec), gathered);
}

std::vector<int64_t> sharded_spatial_dims(const ShardTensorSpec& spec, int64_t num_spatial) {
  std::vector<int64_t> dims;
  for (const DimSharding& s : spec.shardings())
    if (s.tensor_dim >= spec.ndim() - num_spatial) dims.push_back(s.tensor_dim);
  return dims;
}

std::vector<Range> owned_ranges(const ShardTensorSpec& spec, int64_t tensor_dim) {
  const DimSharding* s = spec.sharding_of(tensor_dim);
  if (!s) return {{0, spec.shape()[tensor_dim]}};
  TORCH_INTERNAL_ASSERT(s->mesh_dims.size() == 1, "spatial ops expect one mesh dim per sharded spatial dim");
  return sizes_to_ranges(s->sizes);
}

int64_t sharding_mesh_dim(const ShardTensorSpec& spec, int64_t tensor_dim) {
  const DimSharding* s = spec.sharding_of(tensor_dim);
  return s ? s->mesh_dims.front() : -1;
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
}  // namespace

std::vector<Range> sliding_outputs(const std::vector<Range>& owned, const SlidingWindow& w) {
  std::vector<Range> out(owned.size());
  for (size_t r = 0; r < owned.size(); ++r) {
    out[r].begin = r == 0 ? 0 : std::min(std::max<int64_t>(ceil_div(owned[r].begin, w.stride), 0), w.out_length);
    if (r > 0) out[r - 1].end = out[r].begin;
  }
  out.back().end = w.out_length;
  return out;
}

Range sliding_input_window(Range out, const SlidingWindow& w) {
  if (!out.size()) return {out.begin * w.stride - w.pad, out.begin * w.stride - w.pad};
  return {out.begin * w.stride - w.pad, (out.end - 1) * w.stride - w.pad + w.extent};
}

HaloAxis sliding_axis(const ShardTensorSpec& in, int64_t tensor_dim, const SlidingWindow& w) {
  HaloAxis axis;
  axis.tensor_dim = tensor_dim;
  axis.mesh_dim = sharding_mesh_dim(in, tensor_dim);
  axis.length = in.shape()[tensor_dim];
  axis.owned = owned_ranges(in, tensor_dim);
  for (const Range& out : sliding_outputs(axis.owned, w)) axis.window.push_back(sliding_input_window(out, w));
  return axis;
}

OutputLayout with_output_sizes(OutputLayout layout, int64_t tensor_dim, const std::vector<Range>& ranges) {
  for (DimShardSizes& entry : layout.sizes)
    if (entry.tensor_dim == tensor_dim) entry.sizes = range_sizes(ranges);
  return layout;
}

ShardTensorSpec laid_out(const ShardTensorSpec& spec, const OutputLayout& layout) {
  return ShardTensorSpec(spec.mesh(), layout.placements, spec.shape(), spec.dtype(), layout.sizes);
}

std::vector<ShardTensorSpec> norm_backward_targets(const OpMeta& op, const ShardTensorSpec& in, const OutputLayout& stats,
                                                   const std::function<ShardTensorSpec(const ShardTensorSpec&)>& parameter_target) {
  std::vector<ShardTensorSpec> targets;
  for (const TensorInput& input : op.inputs) {
    const std::string& arg = arg_name(op, input);
    if (arg == "grad_out") targets.push_back(align_to(input.spec, in));
    else if (arg == "input") targets.push_back(in);
    else if (arg == "mean" || arg == "rstd") targets.push_back(laid_out(input.spec, stats));
    else targets.push_back(parameter_target(input.spec));  // weight, bias
  }
  return targets;
}

std::shared_ptr<const KernelPlan> empty_safe(std::shared_ptr<const KernelPlan> inner, std::vector<Follows> follows) {
  EmptySafePlan plan;
  plan.inner = std::move(inner);
  plan.follows = std::move(follows);
  return declare(std::move(plan));
}

std::vector<int64_t> expand_param(const OpMeta& op, const std::string& name, int64_t k, std::vector<int64_t> if_empty) {
  std::vector<int64_t> v = int_list_arg(op, name);
  if (v.empty()) v = std::move(if_empty);
  if (v.size() == 1) v.assign(k, v[0]);
  TORCH_CHECK(static_cast<int64_t>(v.size()) == k, op.name, ": argument '", name, "' must have 1 or ", k, " values, got ",
              v.size());
  return v;
}

}  // namespace shardtensor
