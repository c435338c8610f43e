// Operators that read one dim whole: scans (cumsum, cumprod, cummax, cummin, logcumsumexp),
// sort, topk, flip (which the scans' backward uses) and roll. That dim is gathered first when it is sharded (a scan over a sharded dim
// would need each rank's prefix from the ranks before it); every other dim keeps its sharding,
// so a scan along an unsharded dim moves nothing. Every output (values and indices) takes the
// input's layout; indices count within the whole dim, so they are global as they stand.
//
// histc with an explicit range counts each rank's elements into the same bins: the local
// counts are Partial(sum) on every mesh dim that shards the input, and no bytes move until the
// histogram is read. Without a range (min == max) the range comes from the global min and max,
// which the local data do not know: the rule refuses, and the operator falls back.
#include "rules/helpers.h"

namespace shardtensor {
namespace {

// `outputs`: 1 for a scan, 2 (values, indices) for cummax, cummin, sort and topk.
Rule along_dim_rule(size_t outputs) {
  return [outputs](const OpMeta& op) {
    const ShardTensorSpec& in = op.inputs[0].spec;
    const int64_t dim = wrap_dim(int_arg(op, "dim"), std::max<int64_t>(in.ndim(), 1), op);  // a 0-d tensor takes dim 0 or -1
    const ShardTensorSpec target = replicate_tensor_dims(in, {dim});
    RuleResult r;
    r.input_targets = {target};
    r.outputs.assign(outputs, layout_of(target));
    return r;
  };
}

// flip(self, dims): a flipped sharded dim would put the last rows on the first rank, which no
// layout in rank order describes, so flipped dims are read whole; the others keep their shards.
RuleResult flip_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  std::vector<int64_t> dims;
  for (int64_t d : int_list_arg(op, "dims")) dims.push_back(wrap_dim(d, std::max<int64_t>(in.ndim(), 1), op));
  const ShardTensorSpec target = replicate_tensor_dims(in, dims);
  RuleResult r;
  r.input_targets = {target};
  r.outputs = {layout_of(target)};
  return r;
}

// roll(self, shifts, dims): a rolled sharded dim moves rows across ranks, so rolled dims are
// read whole; without dims the flattened tensor rolls, so the whole tensor is.
RuleResult roll_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  std::vector<int64_t> dims;
  for (int64_t d : int_list_arg(op, "dims")) dims.push_back(wrap_dim(d, std::max<int64_t>(in.ndim(), 1), op));
  const ShardTensorSpec target = dims.empty() ? replicated(in) : replicate_tensor_dims(in, dims);
  RuleResult r;
  r.input_targets = {target};
  r.outputs = {layout_of(target)};
  return r;
}

RuleResult histc_rule(const OpMeta& op) {
  const double low = number_arg(op, "min"), high = number_arg(op, "max");
  if (!(low < high))
    return RuleResult::unsupported("histc without an explicit range (min " + std::to_string(low) + ", max " +
                                   std::to_string(high) + ") takes the range from the whole tensor");
  const ShardTensorSpec target = without_partial(op.inputs[0].spec);
  RuleResult r;
  r.input_targets = {target};
  r.outputs = {OutputLayout{summed_over_shards(target), {}}};
  return r;
}

}  // namespace

void register_scan_rules(RuleRegistry& registry) {
  for (const char* name : {"aten::cumsum", "aten::cumprod", "aten::logcumsumexp", "aten::cumsum_", "aten::cumprod_"})
    registry.add(name, along_dim_rule(1));
  for (const char* name : {"aten::cummax", "aten::cummin", "aten::sort", "aten::sort.stable", "aten::topk"})
    registry.add(name, along_dim_rule(2));
  registry.add("aten::flip", flip_rule);
  registry.add("aten::roll", roll_rule);
  registry.add("aten::histc", histc_rule);
}

}  // namespace shardtensor
