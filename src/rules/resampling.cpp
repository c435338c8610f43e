// Upsampling (nearest, nearest-exact, linear/bilinear/trilinear, bicubic, any scale,
// align_corners either way) and padding (constant, reflect, replicate) along sharded spatial
// dims, forward and backward. Circular padding is a periodic halo (dispatch/decompositions.cpp),
// no rule here.
//
// Each is an index map per dim: output o reads K source positions with weights (nearest and
// the pads read one, linear two, cubic four, clamped at the edges). The maps follow libtorch's own
// index formulas, in the input's precision, so every output reads the same sources as on one
// device. A rank owns the outputs whose first source it owns (upsampling) or that sit
// opposite its rows (padding), gathers the window of sources they read, and applies the map
// with index_select; the backward applies the transposed map with index_add and scatters the
// window gradient back. Constant padding is a window gathered with the pad value as fill.
#include "rules/resampling.h"

#include <ATen/core/function_schema.h>

#include <cmath>

namespace shardtensor {
namespace {

// ---- libtorch's index formulas (UpSample.h), in float where libtorch computes in float ----

double compute_scale(int64_t in, int64_t out, bool align_corners, c10::optional<double> scale, bool as_float) {
  double s;
  if (align_corners) {
    s = out > 1 ? static_cast<double>(in - 1) / (out - 1) : 0.0;
  } else {
    s = (scale && *scale > 0) ? 1.0 / *scale : static_cast<double>(in) / out;
  }
  return as_float ? static_cast<float>(s) : s;
}

// A map of `k` taps, no entries yet.
IndexMap with_taps(size_t k, bool weighted) {
  IndexMap m;
  m.taps.resize(k);
  if (weighted) m.weights.resize(k);
  return m;
}

// The source position of output o (area_pixel_compute_source_index), its floor clamped to the
// last row and the fraction past it clamped to [0, 1] (guard_index_and_lambda).
std::pair<int64_t, double> source_position(double s, int64_t o, int64_t in, bool align_corners, bool cubic, bool as_float) {
  double src = align_corners ? s * o : s * (o + 0.5) - 0.5;
  if (!align_corners && !cubic && src < 0) src = 0;
  if (as_float) src = static_cast<float>(src);
  const int64_t i = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
  double t = std::min(std::max(src - i, 0.0), 1.0);
  if (as_float) t = static_cast<float>(t);
  return {i, t};
}

double in_precision(double v, bool as_float) { return as_float ? static_cast<float>(v) : v; }

IndexMap linear_map(int64_t in, int64_t out, bool align_corners, c10::optional<double> scale, bool as_float) {
  IndexMap m = with_taps(2, true);
  const double s = compute_scale(in, out, align_corners, scale, as_float);
  for (int64_t o = 0; o < out; ++o) {
    const auto [i, w] = source_position(s, o, in, align_corners, /*cubic=*/false, as_float);
    m.taps[0].push_back(i);
    m.taps[1].push_back(i < in - 1 ? i + 1 : i);
    m.weights[0].push_back(in_precision(1.0 - w, as_float));
    m.weights[1].push_back(w);
  }
  return m;
}

// Keys' cubic convolution with A = -0.75 over taps i-1 .. i+2, clamped to the edges
// (get_cubic_upsample_coefficients and upsample_get_value_bounded).
IndexMap cubic_map(int64_t in, int64_t out, bool align_corners, c10::optional<double> scale, bool as_float) {
  IndexMap m = with_taps(4, true);
  const double s = compute_scale(in, out, align_corners, scale, as_float);
  const double A = -0.75;
  auto near = [&](double x) { return in_precision(((A + 2) * x - (A + 3)) * x * x + 1, as_float); };   // |x| <= 1
  auto far = [&](double x) { return in_precision(((A * x - 5 * A) * x + 8 * A) * x - 4 * A, as_float); };  // 1 < |x| < 2
  for (int64_t o = 0; o < out; ++o) {
    const auto [i, t] = source_position(s, o, in, align_corners, /*cubic=*/true, as_float);
    const double u = in_precision(1.0 - t, as_float);
    const double w[4] = {far(in_precision(t + 1.0, as_float)), near(t), near(u), far(in_precision(u + 1.0, as_float))};
    for (int64_t k = 0; k < 4; ++k) {
      m.taps[k].push_back(std::min(std::max<int64_t>(i - 1 + k, 0), in - 1));
      m.weights[k].push_back(w[k]);
    }
  }
  return m;
}

IndexMap nearest_map(int64_t in, int64_t out, c10::optional<double> scale, bool exact) {
  IndexMap m = with_taps(1, false);
  const float s = (scale && *scale > 0) ? static_cast<float>(1.0 / *scale) : static_cast<float>(in) / out;
  for (int64_t o = 0; o < out; ++o) {
    int64_t i;
    if (!exact && out == in) i = o;
    else if (!exact && out == 2 * in) i = o >> 1;
    else i = std::min(static_cast<int64_t>(std::floor(exact ? static_cast<float>((o + 0.5) * s) : o * s)), in - 1);
    m.taps[0].push_back(i);
  }
  return m;
}

IndexMap pad_map(int64_t in, int64_t before, int64_t after, bool reflect) {
  IndexMap m = with_taps(1, false);
  for (int64_t o = 0; o < in + before + after; ++o) {
    int64_t i = o - before;
    if (reflect) i = i < 0 ? -i : i >= in ? 2 * (in - 1) - i : i;
    else i = std::min(std::max<int64_t>(i, 0), in - 1);
    m.taps[0].push_back(i);
  }
  return m;
}

// ---- ownership ----

// Rank r owns the outputs whose first source is at or after its first row (monotone maps).
std::vector<Range> outputs_by_source(const IndexMap& m, const std::vector<Range>& owned) {
  const int64_t out = static_cast<int64_t>(m.taps[0].size());
  std::vector<Range> ranges(owned.size());
  int64_t o = 0;
  for (size_t r = 0; r < owned.size(); ++r) {
    if (r > 0)
      while (o < out && m.taps[0][o] < owned[r].begin) ++o;
    ranges[r].begin = r == 0 ? 0 : o;
    if (r > 0) ranges[r - 1].end = ranges[r].begin;
  }
  ranges.back().end = out;
  return ranges;
}

MapAxis map_axis(int64_t tensor_dim, int64_t mesh_dim, int64_t length, std::vector<Range> owned, IndexMap map,
                 std::vector<Range> outputs) {
  MapAxis a{{tensor_dim, mesh_dim, length, std::move(owned), {}}, std::move(map), std::move(outputs)};
  for (const Range& out : a.outputs) {
    if (!out.size()) {
      a.halo.window.push_back({0, 0});
      continue;
    }
    int64_t lo = a.map.taps[0][out.begin], hi = lo;
    for (const std::vector<int64_t>& tap : a.map.taps)
      for (int64_t o = out.begin; o < out.end; ++o) {
        lo = std::min(lo, tap[o]);
        hi = std::max(hi, tap[o]);
      }
    a.halo.window.push_back({lo, hi + 1});
  }
  return a;
}

// ---- the operators ----

enum class ResampleMode { Nearest, NearestExact, Linear, Cubic, Reflect, Replicate };

struct Resample {
  ResampleMode mode;
  int64_t spatial;
  std::vector<int64_t> in_sizes, out_sizes;   // spatial dims
  std::vector<c10::optional<double>> scales;  // per spatial dim
  bool align_corners = false;
  std::vector<int64_t> pads;                  // (before, after) per spatial dim, for pads
};

int64_t dims_in_name(const std::string& name) {
  for (int64_t k : {1, 2, 3})
    if (name.find(std::to_string(k) + "d") != std::string::npos) return k;
  TORCH_INTERNAL_ASSERT(false, "no dimensionality in ", name);
}

ResampleMode mode_of(const std::string& name) {
  if (name.find("nearest_exact") != std::string::npos) return ResampleMode::NearestExact;
  if (name.find("nearest") != std::string::npos) return ResampleMode::Nearest;
  if (name.find("reflection") != std::string::npos) return ResampleMode::Reflect;
  if (name.find("replication") != std::string::npos) return ResampleMode::Replicate;
  if (name.find("bicubic") != std::string::npos) return ResampleMode::Cubic;
  return ResampleMode::Linear;
}

IndexMap map_of(const Resample& r, int64_t i, bool as_float) {
  switch (r.mode) {
    case ResampleMode::Nearest:
    case ResampleMode::NearestExact:
      return nearest_map(r.in_sizes[i], r.out_sizes[i], r.scales[i], r.mode == ResampleMode::NearestExact);
    case ResampleMode::Linear:
      return linear_map(r.in_sizes[i], r.out_sizes[i], r.align_corners, r.scales[i], as_float);
    case ResampleMode::Cubic:
      return cubic_map(r.in_sizes[i], r.out_sizes[i], r.align_corners, r.scales[i], as_float);
    default:
      return pad_map(r.in_sizes[i], r.pads[2 * i], r.pads[2 * i + 1], r.mode == ResampleMode::Reflect);
  }
}

// The map plan over every spatial dim, given the input rows each rank owns per dim.
IndexMapPlan map_plan(const Resample& r, const ShardTensorSpec& like, const std::vector<std::vector<Range>>& owned, bool as_float,
                      bool backward) {
  IndexMapPlan plan(like.mesh());
  plan.ndim = like.ndim();
  plan.backward = backward;
  const int64_t first = like.ndim() - r.spatial;
  for (int64_t i = 0; i < r.spatial; ++i) {
    IndexMap m = map_of(r, i, as_float);
    const bool is_pad = r.mode == ResampleMode::Reflect || r.mode == ResampleMode::Replicate;
    std::vector<Range> outputs = is_pad ? shifted_ranges(owned[i], r.pads[2 * i], r.out_sizes[i]) : outputs_by_source(m, owned[i]);
    plan.axes.push_back(map_axis(first + i, sharding_mesh_dim(like, first + i), r.in_sizes[i], owned[i], std::move(m), std::move(outputs)));
  }
  return plan;
}

// The scale factor arguments of an upsample over `spatial` (1 to 3, dims_in_name) dims, one
// per dim in order.
std::vector<c10::optional<double>> read_scales(const OpMeta& op, int64_t spatial) {
  static const std::vector<std::vector<std::string>> names = {
      {"scales"}, {"scales_h", "scales_w"}, {"scales_d", "scales_h", "scales_w"}};
  std::vector<c10::optional<double>> v;
  for (const std::string& name : names[spatial - 1]) {
    const std::optional<double> scale = optional_double_arg(op, name);
    v.push_back(scale ? c10::optional<double>(*scale) : c10::nullopt);  // c10::optional is its own type on libtorch 1.13
  }
  return v;
}

// Reads an upsample forward or backward (the backward has grad_output for self, and
// input_size after output_size); align_corners only in linear and cubic modes.
Resample read_upsample(const OpMeta& op, const std::vector<int64_t>& in_shape) {
  Resample r;
  r.mode = mode_of(op.name);
  r.spatial = dims_in_name(op.name);
  r.out_sizes = int_list_arg(op, "output_size");
  r.in_sizes.assign(in_shape.end() - r.spatial, in_shape.end());
  r.align_corners = (r.mode == ResampleMode::Linear || r.mode == ResampleMode::Cubic) && bool_arg(op, "align_corners");
  r.scales = read_scales(op, r.spatial);
  return r;
}

// Reads a reflection/replication pad, forward or backward: padding lists (before, after) from
// the last dim back.
Resample read_pad(const OpMeta& op, const std::vector<int64_t>& in_shape) {
  Resample r;
  r.mode = mode_of(op.name);
  r.spatial = dims_in_name(op.name);
  const std::vector<int64_t> pad = int_list_arg(op, "padding");
  r.in_sizes.assign(in_shape.end() - r.spatial, in_shape.end());
  for (int64_t i = 0; i < r.spatial; ++i) {
    const int64_t from_last = r.spatial - 1 - i;
    r.pads.push_back(pad[2 * from_last]);
    r.pads.push_back(pad[2 * from_last + 1]);
    r.out_sizes.push_back(r.in_sizes[i] + pad[2 * from_last] + pad[2 * from_last + 1]);
  }
  return r;
}

std::vector<std::vector<Range>> owned_per_spatial_dim(const ShardTensorSpec& spec, int64_t spatial) {
  std::vector<std::vector<Range>> owned;
  for (int64_t d = spec.ndim() - spatial; d < spec.ndim(); ++d) owned.push_back(owned_ranges(spec, d));
  return owned;
}

OutputLayout output_layout(const ShardTensorSpec& in, const IndexMapPlan& plan) {
  OutputLayout out = layout_of(in);
  for (const MapAxis& a : plan.axes)
    if (a.halo.mesh_dim >= 0) out = with_output_sizes(out, a.halo.tensor_dim, a.outputs);
  return out;
}

bool computes_in_float(const ShardTensorSpec& spec) { return spec.dtype() != at::kDouble; }

// upsample_*(self, output_size, [align_corners,] scales...) and the pads (self, padding)
RuleResult map_forward_rule(const OpMeta& op) {
  const bool is_pad = op.name.find("_pad") != std::string::npos;
  const ShardTensorSpec& self = op.inputs[0].spec;
  const Resample rs = is_pad ? read_pad(op, self.shape()) : read_upsample(op, self.shape());
  const ShardTensorSpec in = spatial_layout(self, rs.spatial, /*channel_whole=*/false);
  RuleResult r;
  r.input_targets = {in};
  if (sharded_spatial_dims(in, rs.spatial).empty()) {
    r.outputs = {layout_of(in)};
    r.kernel_plan = empty_safe();
    return r;
  }
  IndexMapPlan plan = map_plan(rs, in, owned_per_spatial_dim(in, rs.spatial), computes_in_float(in), /*backward=*/false);
  r.outputs = {output_layout(in, plan)};
  r.kernel_plan = declare(std::move(plan));
  return r;
}

// Pad backward (grad_output, self, padding): self's layout is the gradient's.
RuleResult pad_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& self = op.inputs[1].spec;
  const Resample rs = read_pad(op, self.shape());
  const ShardTensorSpec in = spatial_layout(self, rs.spatial, false);
  RuleResult r;
  if (sharded_spatial_dims(in, rs.spatial).empty()) {
    r.input_targets = {align_to(op.inputs[0].spec, in), in};
    r.outputs = {layout_of(in)};
    r.kernel_plan = empty_safe();
    return r;
  }
  IndexMapPlan plan = map_plan(rs, in, owned_per_spatial_dim(in, rs.spatial), false, /*backward=*/true);
  r.input_targets = {laid_out(op.inputs[0].spec, output_layout(in, plan)), in};
  r.outputs = {layout_of(in)};
  r.kernel_plan = declare(std::move(plan));
  return r;
}

// Upsample backward (grad_output, output_size, input_size, ...): only the gradient is a
// tensor, so the input rows each rank gets back are those where its outputs' sources start.
RuleResult upsample_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& grad_spec = op.inputs[0].spec;
  const std::vector<int64_t> input_size = int_list_arg(op, "input_size");
  const Resample rs = read_upsample(op, input_size);
  const ShardTensorSpec grad = spatial_layout(grad_spec, rs.spatial, false);
  RuleResult r;
  OutputLayout in_layout = layout_of(grad);
  if (sharded_spatial_dims(grad, rs.spatial).empty()) {
    r.input_targets = {grad};
    r.outputs = {in_layout};
    // input_size is global; its batch and channel entries must be this rank's.
    r.kernel_plan = empty_safe(declare(LocalInputSizePlan{}));
    return r;
  }
  std::vector<std::vector<Range>> owned;
  const int64_t first = grad.ndim() - rs.spatial;
  const bool as_float = computes_in_float(grad);
  for (int64_t i = 0; i < rs.spatial; ++i) {
    const std::vector<Range> outs = owned_ranges(grad, first + i);
    const IndexMap m = map_of(rs, i, as_float);
    std::vector<Range> rows(outs.size());
    for (size_t q = 0; q < outs.size(); ++q) {
      const int64_t source = outs[q].begin < rs.out_sizes[i] ? m.taps[0][outs[q].begin] : rs.in_sizes[i];
      rows[q].begin = q == 0 ? 0 : std::max(rows[q - 1].begin, source);
      if (q > 0) rows[q - 1].end = rows[q].begin;
    }
    rows.back().end = rs.in_sizes[i];
    owned.push_back(rows);
    if (sharding_mesh_dim(grad, first + i) >= 0) in_layout = with_output_sizes(in_layout, first + i, rows);
  }
  IndexMapPlan plan = map_plan(rs, grad, owned, as_float, /*backward=*/true);
  r.input_targets = {laid_out(grad_spec, output_layout(grad, plan))};
  r.outputs = {in_layout};
  r.kernel_plan = declare(std::move(plan));
  return r;
}

// ---- constant padding: a window gathered with the pad value as fill ----

// constant_pad_nd(self, pad, value): pad lists (before, after) from the last dim back;
// negative entries crop (the backward is constant_pad_nd with the pads negated).
RuleResult constant_pad_rule(const OpMeta& op) {
  const ShardTensorSpec& self = op.inputs[0].spec;
  const std::vector<int64_t> pad = int_list_arg(op, "pad");
  const int64_t padded = static_cast<int64_t>(pad.size()) / 2;
  std::vector<int64_t> nested;
  for (const DimSharding& s : self.shardings())
    if (s.tensor_dim >= self.ndim() - padded && s.mesh_dims.size() > 1) nested.push_back(s.tensor_dim);
  // A pending reduction stays pending where every term padded with `value` reduces to `value`:
  // always for avg, max and min, for sum and norm only when it is 0.
  const bool pads_zero = op.arg("value").toScalar().toDouble() == 0.0;
  Placements keep = self.placements();
  for (Placement& p : keep)
    if (p.is_partial() && (p.reduce_op == ReduceOp::Product ||
                           ((p.reduce_op == ReduceOp::Sum || p.reduce_op == ReduceOp::Norm) && !pads_zero)))
      p = Replicate();
  const ShardTensorSpec in = keep_shared_partials(replicate_tensor_dims(without_partial(self), nested), {with_placements(self, keep)});
  ConstantPadPlan plan(in.mesh(), op.arg("value").toScalar().toDouble());
  OutputLayout out = layout_of(in);
  std::vector<int64_t> local_pad = pad;
  for (const DimSharding& s : in.shardings()) {
    const int64_t from_last = in.ndim() - 1 - s.tensor_dim;
    if (from_last >= padded) continue;
    const int64_t before = pad[2 * from_last], after = pad[2 * from_last + 1], length = in.shape()[s.tensor_dim];
    HaloAxis axis{s.tensor_dim, s.mesh_dims.front(), length, sizes_to_ranges(s.sizes), {}};
    const std::vector<Range> outputs = shifted_ranges(axis.owned, before, length + before + after);
    for (const Range& o : outputs) axis.window.push_back({o.begin - before, o.end - before});
    out = with_output_sizes(out, s.tensor_dim, outputs);
    plan.halo.axes.push_back(std::move(axis));
    local_pad[2 * from_last] = local_pad[2 * from_last + 1] = 0;
  }
  RuleResult r;
  r.input_targets = {in};
  r.outputs = {out};
  if (plan.halo.axes.empty()) {
    r.kernel_plan = empty_safe();
    return r;
  }
  plan.local_pad = local_pad;
  r.kernel_plan = declare(std::move(plan));
  return r;
}

}  // namespace

MoveLowering IndexMapPlan::move_lowering() const {
  MoveLowering how{mesh};
  for (const MapAxis& a : axes) how.halo.push_back(a.halo);
  return how;
}

std::vector<MoveStep> IndexMapPlan::moves() const {
  const HaloPlan halo{mesh, move_lowering().halo};
  return backward ? halo_scatter_adds(halo) : halo_gathers(halo);
}

// grid_sampler_{2,3}d(input, grid, ...): every output point reads the input where its grid
// point says, anywhere in the image, so the batch dim alone keeps its shards; the grid follows
// the input's batch. Backward (grad_output, input, grid, ...) gives grad_input and grad_grid laid
// out like input and grid.
RuleResult grid_sampler_rule(const OpMeta& op) {
  const ShardTensorSpec target = keep_leading_dims(op.input_named("input")->spec, 1);
  RuleResult r;
  for (const TensorInput& in : op.inputs)
    r.input_targets.push_back(arg_name(op, in) == "input" ? target : leading_like(in.spec, target, 1));
  r.outputs = {layout_of(target)};
  if (op.schema->returns().size() == 2) r.outputs.push_back(layout_of(leading_like(op.input_named("grid")->spec, target, 1)));
  return r;
}

// Anti-aliased resampling (_upsample_*_aa): its kernel's support grows with the scale, so the
// spatial dims are read whole; the batch keeps its shards (libtorch refuses empty channels).
RuleResult resample_whole_spatial_rule(const OpMeta& op) {
  const ShardTensorSpec target = keep_leading_dims(op.input_named("self")->spec, 1);
  RuleResult r;
  r.input_targets = {target};
  r.outputs = {layout_of(target)};
  return r;
}

void register_resampling_rules(RuleRegistry& registry) {
  for (const char* name : {"aten::grid_sampler_2d", "aten::grid_sampler_3d", "aten::grid_sampler_2d_backward",
                           "aten::grid_sampler_3d_backward"})
    registry.add(name, grid_sampler_rule);
  for (const char* name : {"aten::_upsample_bilinear2d_aa", "aten::_upsample_bicubic2d_aa", "aten::_upsample_lanczos2d_aa"})
    registry.add(name, resample_whole_spatial_rule);
  for (const char* name : {"aten::upsample_nearest1d", "aten::upsample_nearest2d", "aten::upsample_nearest3d",
                           "aten::_upsample_nearest_exact1d", "aten::_upsample_nearest_exact2d",
                           "aten::_upsample_nearest_exact3d", "aten::upsample_linear1d", "aten::upsample_bilinear2d",
                           "aten::upsample_trilinear3d", "aten::upsample_bicubic2d", "aten::reflection_pad1d", "aten::reflection_pad2d",
                           "aten::reflection_pad3d", "aten::replication_pad1d", "aten::replication_pad2d",
                           "aten::replication_pad3d"})
    registry.add(name, map_forward_rule);
  for (const char* name : {"aten::upsample_nearest1d_backward", "aten::upsample_nearest2d_backward",
                           "aten::upsample_nearest3d_backward", "aten::_upsample_nearest_exact1d_backward",
                           "aten::_upsample_nearest_exact2d_backward", "aten::_upsample_nearest_exact3d_backward",
                           "aten::upsample_linear1d_backward", "aten::upsample_bilinear2d_backward",
                           "aten::upsample_trilinear3d_backward", "aten::upsample_bicubic2d_backward"})
    registry.add(name, upsample_backward_rule);
  for (const char* name : {"aten::reflection_pad1d_backward", "aten::reflection_pad2d_backward",
                           "aten::reflection_pad3d_backward", "aten::replication_pad1d_backward",
                           "aten::replication_pad2d_backward", "aten::replication_pad3d_backward"})
    registry.add(name, pad_backward_rule);
  registry.add("aten::constant_pad_nd", constant_pad_rule);
}

}  // namespace shardtensor
