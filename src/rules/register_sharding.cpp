// DTensor's register_sharding: a rule built from the shardings an operator accepts on one mesh
// dim. Pure like every rule: the same metadata on every rank gives the same choice.
#include <ATen/core/function_schema.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <sstream>

#include "redistribute/plan.h"
#include "rules/helpers.h"
#include "rules/registry.h"

namespace shardtensor {
namespace {

// At most this many combinations are costed (options ^ mesh dims); DTensor expands the same
// product, and a strategy list this long on a deep mesh is a mistake worth naming.
constexpr size_t kMaxCombinations = 4096;

size_t tensor_output_count(const OpMeta& op) {
  size_t n = 0;
  for (const c10::Argument& r : op.schema->returns())
    if (r.type()->kind() == c10::TypeKind::TensorType) ++n;
  return n;
}

std::string describe_option(const std::vector<std::optional<Placement>>& ps) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ps.size(); ++i) os << (i ? ", " : "") << (ps[i] ? to_string(*ps[i]) : std::string("None"));
  return os.str() + "]";
}

// The option's placement for each tensor input, in the order of op.inputs.
Placements per_input(const OpMeta& op, const AcceptableSharding& option, size_t index) {
  const size_t args = op.schema->arguments().size();
  Placements out;
  if (option.inputs.size() == args) {
    for (const TensorInput& in : op.inputs) {
      const std::optional<Placement>& p = option.inputs[in.arg_index];
      TORCH_CHECK_VALUE(p, op.name, ": acceptable sharding ", index, " gives no placement (None) for tensor argument '",
                        arg_name(op, in), "': ", describe_option(option.inputs));
      out.push_back(*p);
    }
    return out;
  }
  for (const std::optional<Placement>& p : option.inputs)
    if (p) out.push_back(*p);
  TORCH_CHECK_VALUE(out.size() == op.inputs.size(), op.name, ": acceptable sharding ", index, " has input placements ",
                    describe_option(option.inputs), "; give one per argument of the schema (", args,
                    ", None for non-tensors) or one per tensor input (", op.inputs.size(), " in this call)");
  return out;
}

void check_shard_dim(const OpMeta& op, const Placement& p, int64_t ndim, const std::string& what) {
  TORCH_CHECK_VALUE(!p.is_shard() || (p.tensor_dim >= 0 && p.tensor_dim < ndim), op.name, ": ", what, " is ", to_string(p),
                    ", but that tensor has ", ndim, " dims (Shard dims 0 to ", ndim - 1, ")");
}

// Normalised options: per option, the placement of every tensor input and every output.
struct Option {
  Placements inputs;
  Placements outputs;
};

std::vector<Option> normalise(const OpMeta& op, const std::vector<AcceptableSharding>& given) {
  TORCH_CHECK_VALUE(!given.empty(), op.name, ": its register_sharding function returned no acceptable sharding");
  const size_t outputs = tensor_output_count(op);
  std::vector<Option> options;
  for (size_t i = 0; i < given.size(); ++i) {
    Option o;
    o.inputs = per_input(op, given[i], i);
    for (size_t k = 0; k < o.inputs.size(); ++k) {
      Placement& p = o.inputs[k];
      const int64_t ndim = op.inputs[k].spec.ndim();
      if (p.is_shard() && p.tensor_dim < 0) p.tensor_dim += ndim;
      check_shard_dim(op, p, ndim, "the placement of tensor argument '" + arg_name(op, op.inputs[k]) + "'");
    }
    TORCH_CHECK_VALUE(given[i].outputs.size() == outputs, op.name, ": acceptable sharding ", i, " has ",
                      given[i].outputs.size(), " output placements ", describe_option(given[i].outputs), "; the operator has ",
                      outputs, " tensor outputs");
    for (const std::optional<Placement>& p : given[i].outputs) {
      TORCH_CHECK_VALUE(p, op.name, ": acceptable sharding ", i, " gives no placement (None) for an output");
      TORCH_CHECK_VALUE(!p->is_shard() || p->tensor_dim >= 0, op.name, ": acceptable sharding ", i, " has output ",
                        to_string(*p), "; write output Shard dims as non-negative numbers");
      o.outputs.push_back(*p);
    }
    options.push_back(std::move(o));
  }
  return options;
}

// The sizes of output tensor dim `dim`, sharded by `mesh_dims`: those of an input dim sharded
// by the same mesh dims in the same order.
DimShardSizes output_sizes(const OpMeta& op, const std::vector<ShardTensorSpec>& targets, int64_t dim,
                           const std::vector<int64_t>& mesh_dims, size_t output) {
  for (const ShardTensorSpec& t : targets)
    for (const DimSharding& s : t.shardings())
      if (s.mesh_dims == mesh_dims) return {dim, s.sizes};
  std::ostringstream dims;
  for (int64_t m : mesh_dims) dims << " " << m;
  TORCH_CHECK_VALUE(false, op.name, ": output ", output, " would be Shard(", dim, ") over mesh dims", dims.str(),
                    ", but no input is sharded over those mesh dims, so the sizes of its pieces are unknown");
}

OutputLayout output_layout(const OpMeta& op, const std::vector<ShardTensorSpec>& targets, const Placements& placements,
                           size_t output) {
  OutputLayout layout{placements, {}};
  std::vector<int64_t> dims;
  for (const Placement& p : placements)
    if (p.is_shard() && std::find(dims.begin(), dims.end(), p.tensor_dim) == dims.end()) dims.push_back(p.tensor_dim);
  for (int64_t dim : dims) {
    std::vector<int64_t> mesh_dims;
    for (size_t m = 0; m < placements.size(); ++m)
      if (placements[m].is_shard(dim)) mesh_dims.push_back(static_cast<int64_t>(m));
    layout.sizes.push_back(output_sizes(op, targets, dim, mesh_dims, output));
  }
  return layout;
}

double move_cost(const ShardTensorSpec& from, const ShardTensorSpec& to) {
  if (from == to) return 0.0;
  try {
    return plan_redistribute(from, to)->cost();
  } catch (const c10::Error&) {
    return std::numeric_limits<double>::infinity();  // no redistribution reaches it (S -> P)
  }
}

RuleResult choose(const OpMeta& op, const std::vector<Option>& options) {
  const size_t mesh_ndim = static_cast<size_t>(op.mesh().ndim());
  size_t combinations = 1;
  for (size_t m = 0; m < mesh_ndim; ++m) {
    combinations *= options.size();
    TORCH_CHECK_VALUE(combinations <= kMaxCombinations, op.name, ": ", options.size(), " acceptable shardings over a ",
                      mesh_ndim, "-d mesh make more than ", kMaxCombinations, " combinations to cost");
  }
  double best_cost = std::numeric_limits<double>::infinity();
  RuleResult best;
  for (size_t c = 0; c < combinations; ++c) {
    std::vector<size_t> pick(mesh_ndim);
    for (size_t m = mesh_ndim, rest = c; m-- > 0; rest /= options.size()) pick[m] = rest % options.size();
    std::vector<ShardTensorSpec> targets;
    double cost = 0.0;
    bool moves_written = false;
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      Placements ps;
      for (size_t m = 0; m < mesh_ndim; ++m) ps.push_back(options[pick[m]].inputs[k]);
      const ShardTensorSpec& from = op.inputs[k].spec;
      targets.push_back(ps == from.placements() ? from : relayout(from, ps, {}));
      cost += move_cost(from, targets.back());
      moves_written |= k == 0 && op.is_inplace() && !(targets.back() == from);
    }
    if (moves_written || !(cost < best_cost)) continue;
    RuleResult r;
    r.input_targets = targets;
    for (size_t o = 0; o < options.front().outputs.size(); ++o) {
      Placements ps;
      for (size_t m = 0; m < mesh_ndim; ++m) ps.push_back(options[pick[m]].outputs[o]);
      r.outputs.push_back(output_layout(op, targets, ps, o));
    }
    best = std::move(r);
    best_cost = cost;
  }
  if (best_cost == std::numeric_limits<double>::infinity())
    return RuleResult::unsupported("no acceptable sharding of its register_sharding function is reachable from its "
                                   "inputs' layouts" + std::string(op.is_inplace() ? " without moving the written argument" : ""));
  return best;
}

}  // namespace

void register_sharding(const std::string& op_name, ShardingStrategy strategy) {
  TORCH_CHECK_VALUE(strategy, "register_sharding: the function for '", op_name, "' is empty.");
  register_sharding_rule(op_name, [strategy = std::move(strategy)](const OpMeta& op) {
    return choose(op, normalise(op, strategy(op)));
  });
}

}  // namespace shardtensor
