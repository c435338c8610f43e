// See helpers.h.
#include "rules/helpers.h"

#include <ATen/core/function_schema.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "redistribute/plan.h"
#include "util/strings.h"

namespace shardtensor {

ShardTensorSpec with_placements(const ShardTensorSpec& spec, const Placements& placements) {
  if (placements == spec.placements()) return spec;
  return relayout(spec, placements, {});
}

ShardTensorSpec without_partial(const ShardTensorSpec& spec) {
  if (!spec.has_partial()) return spec;
  Placements ps = spec.placements();
  for (Placement& p : ps)
    if (p.is_partial()) p = Replicate();
  return with_placements(spec, ps);
}

ShardTensorSpec keep_linear_partials(const ShardTensorSpec& spec) {
  Placements ps = spec.placements();
  for (Placement& p : ps)
    if (p.is_partial() && !is_sum_or_avg(p.reduce_op)) p = Replicate();
  return with_placements(spec, ps);
}

ShardTensorSpec replicate_tensor_dims(const ShardTensorSpec& spec, const std::vector<int64_t>& tensor_dims) {
  Placements ps = spec.placements();
  for (Placement& p : ps) {
    const bool reads_whole = p.is_shard() && std::count(tensor_dims.begin(), tensor_dims.end(), p.tensor_dim) > 0;
    if (reads_whole || p.is_partial()) p = Replicate();
  }
  return with_placements(spec, ps);
}

ShardTensorSpec keep_leading_dims(const ShardTensorSpec& spec, int64_t n) {
  std::vector<int64_t> trailing;
  for (int64_t d = std::max<int64_t>(n, 0); d < spec.ndim(); ++d) trailing.push_back(d);
  return replicate_tensor_dims(spec, trailing);
}

ShardTensorSpec leading_like(const ShardTensorSpec& spec, const ShardTensorSpec& lead, int64_t n) {
  Placements ps = lead.placements();
  for (Placement& p : ps)
    if (!p.is_shard() || p.tensor_dim >= n || p.tensor_dim >= spec.ndim()) p = Replicate();
  ShardTensorSpec t = with_placements(spec, ps);
  for (const DimSharding& s : lead.shardings())
    if (s.tensor_dim < n && s.tensor_dim < spec.ndim()) t = with_dim_sizes(t, s.tensor_dim, s.sizes);
  return t;
}

ShardTensorSpec with_dim_sizes(const ShardTensorSpec& spec, int64_t tensor_dim, const std::vector<int64_t>& sizes) {
  const DimSharding* s = spec.sharding_of(tensor_dim);
  TORCH_INTERNAL_ASSERT(s, "with_dim_sizes: tensor dim ", tensor_dim, " is not sharded in ", spec);
  if (s->sizes == sizes) return spec;
  ShardSizes table = spec.shard_sizes();
  for (DimShardSizes& entry : table)
    if (entry.tensor_dim == tensor_dim) entry.sizes = sizes;
  return ShardTensorSpec(spec.mesh(), spec.placements(), spec.shape(), spec.dtype(), table);
}

ShardTensorSpec replicated(const ShardTensorSpec& spec) {
  return with_placements(spec, Placements(spec.mesh().ndim(), Replicate()));
}

OutputLayout layout_of(const ShardTensorSpec& spec) { return {spec.placements(), spec.shard_sizes()}; }

OutputLayout remap_dims(const ShardTensorSpec& spec, const std::vector<int64_t>& dim_map) {
  OutputLayout out{spec.placements(), {}};
  for (Placement& p : out.placements) {
    if (!p.is_shard()) continue;
    TORCH_INTERNAL_ASSERT(dim_map[p.tensor_dim] >= 0, "remap_dims: sharded tensor dim ", p.tensor_dim, " disappears");
    p.tensor_dim = dim_map[p.tensor_dim];
  }
  for (const DimSharding& s : spec.shardings()) out.sizes.push_back({dim_map[s.tensor_dim], s.sizes});
  return out;
}

OutputLayout replicated_layout(const DeviceMesh& mesh) { return {Placements(mesh.ndim(), Replicate()), {}}; }

int64_t wrap_dim(int64_t dim, int64_t ndim, const OpMeta& op) {
  const int64_t range = std::max<int64_t>(ndim, 1);
  TORCH_CHECK(dim >= -range && dim < range, op.name, ": dim ", dim, " is out of range for a ", ndim,
              "-d tensor; valid dims are [", -range, ", ", range, ").");
  return dim < 0 ? dim + range : dim;
}

std::vector<int64_t> reduction_dims(const c10::IValue& arg, int64_t ndim, const OpMeta& op) {
  std::vector<int64_t> dims;
  if (arg.isInt()) {
    dims.push_back(wrap_dim(arg.toInt(), ndim, op));
  } else if (arg.isIntList()) {
    for (int64_t d : arg.toIntVector()) dims.push_back(wrap_dim(d, ndim, op));
  }
  if (dims.empty())
    for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  return dims;
}

int64_t int_arg(const OpMeta& op, const std::string& name) { return op.arg(name).toInt(); }

bool bool_arg(const OpMeta& op, const std::string& name, bool if_none) {
  const c10::IValue& v = op.arg(name);
  return v.isNone() ? if_none : v.toBool();
}

std::vector<int64_t> int_list_arg(const OpMeta& op, const std::string& name) { return op.arg(name).toIntVector(); }

std::optional<int64_t> optional_int_arg(const OpMeta& op, const std::string& name) {
  const c10::IValue& v = op.arg(name);
  return v.isNone() ? std::nullopt : std::optional<int64_t>(v.toInt());
}

namespace {

// A double, int or bool IValue alike: toScalar() takes each as what it is.
double as_number(const OpMeta& op, const std::string& name, const c10::IValue& v) {
  TORCH_CHECK(v.isScalar(), op.name, ": argument '", name, "' is a ", v.tagKind(), ", not a number.");
  return v.toScalar().toDouble();
}

}  // namespace

double number_arg(const OpMeta& op, const std::string& name) { return as_number(op, name, op.arg(name)); }

std::optional<double> optional_double_arg(const OpMeta& op, const std::string& name) {
  const c10::IValue& v = op.arg(name);
  return v.isNone() ? std::nullopt : std::optional<double>(as_number(op, name, v));
}

const std::string& arg_name(const OpMeta& op, const TensorInput& in) {
  TORCH_CHECK(op.schema && in.arg_index < op.schema->arguments().size(), op.name, ": input from argument ", in.arg_index,
              " is not in the schema");
  return op.schema->arguments()[in.arg_index].name();
}

std::vector<int64_t> sharding_mesh_dims(const ShardTensorSpec& spec, const std::function<bool(int64_t)>& pred) {
  std::vector<int64_t> dims;
  for (size_t m = 0; m < spec.placements().size(); ++m)
    if (spec.placements()[m].is_shard() && (!pred || pred(spec.placements()[m].tensor_dim))) dims.push_back(static_cast<int64_t>(m));
  return dims;
}

std::vector<int64_t> partial_mesh_dims(const ShardTensorSpec& spec) {
  std::vector<int64_t> dims;
  for (size_t m = 0; m < spec.placements().size(); ++m)
    if (spec.placements()[m].is_partial()) dims.push_back(static_cast<int64_t>(m));
  return dims;
}

ShardTensorSpec align_to(const ShardTensorSpec& spec, const ShardTensorSpec& lead) {
  ShardTensorSpec t = with_placements(spec, lead.placements());
  for (const DimSharding& s : lead.shardings()) t = with_dim_sizes(t, s.tensor_dim, s.sizes);
  return t;
}

int64_t numel_of(const ShardTensorSpec& spec) {
  int64_t n = 1;
  for (int64_t s : spec.shape()) n *= s;
  return n;
}

ShardTensorSpec keep_shared_partials(const ShardTensorSpec& resolved, const std::vector<ShardTensorSpec>& operands) {
  Placements ps = resolved.placements();
  for (size_t m = 0; m < ps.size(); ++m) {
    if (!ps[m].is_replicate()) continue;
    std::optional<Placement> shared;
    bool alike = true;
    for (const ShardTensorSpec& o : operands) {
      if (o.ndim() != resolved.ndim()) continue;
      const Placement& p = o.placements()[m];
      alike = alike && p.is_partial() && (!shared || *shared == p);
      shared = p;
    }
    if (alike && shared) ps[m] = *shared;
  }
  return with_placements(resolved, ps);
}

Placements summed_over_shards(const ShardTensorSpec& spec) {
  Placements ps(spec.placements().size(), Replicate());
  for (size_t m = 0; m < ps.size(); ++m)
    if (spec.placements()[m].is_shard()) ps[m] = Partial(ReduceOp::Sum);
  return ps;
}

}  // namespace shardtensor
