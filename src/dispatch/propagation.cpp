// See propagation.h. The cache is per thread (no lock on the hot path); the autograd engine
// runs CPU backward on the calling thread, so forward and backward share it.
#include "dispatch/propagation.h"
#include "dispatch/propagation_key.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "comm/comm.h"
#include "dispatch/dispatch_state.h"
#include "dispatch/op_name.h"
#include "dispatch/plain_gradients.h"
#include "dispatch/shard_tensor_impl.h"
#include "rules/helpers.h"
#include "rules/kernel_plan.h"
#include "rules/registry.h"
#include "shardtensor/dispatch.h"
#include "shardtensor/log.h"
#include "spec/sequence_order.h"
#include "util/strings.h"

namespace shardtensor {
namespace propagation_key {

uint64_t hash_tensor(const at::Tensor& t) {
  if (!t.defined()) return kUndefinedTensorHash;
  if (ShardTensorImpl* impl = shard_tensor_impl(t)) return mix(kShardTensorTag, impl->spec().hash());
  uint64_t h = mix(kPlainTensorTag, static_cast<uint64_t>(t.scalar_type()));
  for (int64_t s : t.sizes()) h = mix(h, static_cast<uint64_t>(s));
  return h;
}

// Hash of an argument; tensors contribute their spec (or plain shape), not their data.
uint64_t hash_argument(const c10::IValue& v) {
  if (v.isTensor()) return propagation_key::hash_tensor(v.toTensor());  // qualified: torch 2.x has an at::hash_tensor
  if (v.isNone()) return kNoneHash;
  if (v.isInt()) return mix(kIntTag, static_cast<uint64_t>(v.toInt()));
  if (v.isBool()) return mix(kBoolTag, v.toBool());
  if (v.isDouble()) {
    const double d = v.toDouble();
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    return mix(kDoubleTag, bits);
  }
  if (v.isString()) return mix(kStringTag, std::hash<std::string>()(v.toStringRef()));
  if (v.isDevice()) return mix(kDeviceTag, static_cast<uint64_t>(v.toDevice().type()) * 1000 + v.toDevice().index() + 1);
  if (v.isList()) {
    uint64_t h = kListSeed;
    for (const c10::IValue& e : v.toListRef()) h = mix(h, hash_argument(e));
    return h;
  }
  return mix(kOtherTag, static_cast<uint64_t>(v.tagKind().size()));  // other kinds: none that rules read
}

// Equality of two non-tensor arguments, of the kinds rules read; other kinds compare by
// identity (a generator), which at worst rebuilds a propagation that could have been reused.
bool same_argument(const c10::IValue& a, const c10::IValue& b) {
  if (a.isNone() || b.isNone()) return a.isNone() && b.isNone();
  if (a.isInt()) return b.isInt() && a.toInt() == b.toInt();
  if (a.isBool()) return b.isBool() && a.toBool() == b.toBool();
  if (a.isDouble()) {
    if (!b.isDouble()) return false;
    const double x = a.toDouble(), y = b.toDouble();
    return std::memcmp(&x, &y, sizeof x) == 0;  // bitwise: -0.0 and NaN payloads are arguments too
  }
  if (a.isString()) return b.isString() && a.toStringRef() == b.toStringRef();
  if (a.isDevice()) return b.isDevice() && a.toDevice() == b.toDevice();
  if (a.isComplexDouble()) return b.isComplexDouble() && a.toComplexDouble() == b.toComplexDouble();
  if (a.isList()) {
    if (!b.isList()) return false;
    const auto x = a.toListRef(), y = b.toListRef();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!same_argument(x[i], y[i])) return false;
    return true;
  }
  return a.isSameIdentity(b);
}

bool same_input_spec(const at::Tensor& t, const ShardTensorSpec& built_for) {
  // The same groups too: the kernel lowered for built_for keeps its mesh and runs its moves there.
  if (ShardTensorImpl* impl = shard_tensor_impl(t))
    return impl->spec() == built_for && impl->spec().mesh().same_groups(built_for.mesh());
  return t.sizes().equals(built_for.shape()) && t.scalar_type() == built_for.dtype();
}

}  // namespace propagation_key

namespace {

using propagation_key::hash_argument;
using propagation_key::same_argument;
using propagation_key::same_input_spec;

// Calls `visit(tensor, arg_index)` for every tensor argument that is a rule input, lists
// flattened, out= arguments and undefined optionals skipped.
template <typename Visit>
void for_each_input_tensor(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, Visit&& visit) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_out_argument(schema, i)) continue;
    const c10::IValue& arg = args[i];
    if (arg.isTensor()) {
      if (arg.toTensor().defined()) visit(arg.toTensor(), i);
    } else if (arg.isList()) {
      for (const c10::IValue& e : arg.toListRef())
        if (e.isTensor() && e.toTensor().defined()) visit(e.toTensor(), i);
    }
  }
}

bool is_tensor_argument(const c10::IValue& v) {
  if (v.isTensor()) return true;
  if (!v.isList()) return false;
  for (const c10::IValue& e : v.toListRef())
    if (e.isTensor()) return true;
  return false;
}

bool matches(const Propagation& p, const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  if (args.size() != p.arguments.size()) return false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_out_argument(schema, i)) continue;
    if (is_tensor_argument(args[i]) != p.tensor_arguments[i]) return false;
    if (!p.tensor_arguments[i] && !same_argument(args[i], p.arguments[i])) return false;
  }
  size_t k = 0;
  bool same = true;
  for_each_input_tensor(schema, args, [&](const at::Tensor& t, size_t) {
    if (!same || k >= p.meta.inputs.size()) {
      same = false;
      return;
    }
    same = same_input_spec(t, p.meta.inputs[k++].spec);
  });
  return same && k == p.meta.inputs.size();
}

std::string describe_args(const OpMeta& meta) {
  std::vector<std::string> parts;
  for (const TensorInput& in : meta.inputs) parts.push_back(in.spec.to_string());
  return join(parts, ", ");
}

bool changes_shape_in_place(const std::string& name) {
  // t_, transpose_, unsqueeze_ and squeeze_ never get here (dispatch/in_place_shape.h).
  static const char* const kOps[] = {"aten::as_strided_", "aten::resize_", "aten::resize_as_"};
  const std::string base = name.substr(0, name.find('.'));
  for (const char* op : kOps)
    if (base == op) return true;
  return false;
}

RuleResult fallback_result(const OpMeta& meta) {
  RuleResult r;
  for (const TensorInput& in : meta.inputs) r.input_targets.push_back(replicated(in.spec));
  return r;
}

bool runs_on_local_pieces_alone(const Propagation& p) {
  const c10::FunctionSchema& schema = *p.meta.schema;
  for (size_t i = 0; i < schema.arguments().size(); ++i)
    if (is_out_argument(schema, i) || is_written_input(schema, i)) return false;
  for (const auto& plan : p.plans)
    if (plan) return false;
  // A rule's kernel qualifies where it declares no moves (a local reshape); only declared ones can say so.
  const bool local_kernel_only = !p.result.local_kernel || (p.result.kernel_plan && p.kernel_moves.empty());
  // SHARDTENSOR_LOG is read once per process: logged calls take the boxed kernel, which logs.
  return !log_enabled() && !p.fallback && local_kernel_only && !p.meta.is_inplace() && p.meta.mesh().includes_this_rank() &&
         p.result.outputs.size() == 1 && schema.returns().size() == 1 &&
         schema.returns()[0].type()->kind() == c10::TypeKind::TensorType;
}

// Why `result` of a rule that carries the zigzag order cannot stand, or "": an output split
// in order on a mesh dim where an input runs in zigzag order would hold its positions unnamed.
std::string drops_order(const RuleResult& result) {
  if (!result.unsupported_reason.empty()) return "its sharding rule refuses zigzag inputs: " + result.unsupported_reason;
  for (const ShardTensorSpec& target : result.input_targets)
    for (size_t m = 0; m < target.placements().size(); ++m) {
      if (!target.placements()[m].is_zigzag()) continue;
      for (const OutputLayout& out : result.outputs)
        if (out.placements[m].is_shard() && !out.placements[m].is_zigzag())
          return "its sharding rule keeps mesh dim " + std::to_string(m) + " split but drops the zigzag order";
    }
  return "";
}

// The rule's result, where ZigzagShard inputs (shardtensor/placement.h) reach only a rule that
// carries their order (RuleRegistry::carry_order). Any other rule, and a carrying one that
// refuses or drops the order, is handed the inputs in order; the input plans then move them so.
RuleResult zigzag_aware_result(const Rule& rule, OpMeta& meta) {
  const bool zigzag = std::any_of(meta.inputs.begin(), meta.inputs.end(), [](const TensorInput& in) { return has_zigzag(in.spec); });
  if (!zigzag) return rule(meta);
  std::string why = "its sharding rule does not carry the zigzag order";
  if (rule_registry().carries_order(meta.name)) {
    RuleResult carried = rule(meta);
    why = drops_order(carried);
    if (why.empty()) return carried;
  }
  note_order_fallback(meta.name, why);
  // The rule sees the inputs in order; they get their own layouts back (the plans' sources).
  struct Restore {
    OpMeta& meta;
    std::vector<ShardTensorSpec> held;
    ~Restore() {
      for (size_t k = 0; k < held.size(); ++k) meta.inputs[k].spec = held[k];
    }
  } restore{meta, {}};
  for (TensorInput& in : meta.inputs) restore.held.push_back(std::exchange(in.spec, in_order(in.spec)));
  return rule(meta);
}

std::unique_ptr<Propagation> build(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  auto p = std::make_unique<Propagation>();
  const c10::FunctionSchema& schema = op.schema();
  OpMeta& meta = p->meta;
  meta.name = full_op_name(op.operator_name());
  p->permutes_dims = meta.name == "aten::t" || meta.name == "aten::transpose.int" || meta.name == "aten::permute";
  meta.schema = &schema;

  const DeviceMesh* mesh = nullptr;
  for_each_input_tensor(schema, args, [&](const at::Tensor& t, size_t) {
    if (!mesh && shard_tensor_impl(t)) mesh = &shard_tensor_impl(t)->spec().mesh();
  });
  TORCH_INTERNAL_ASSERT(mesh, meta.name, ": reached the ShardTensor kernel without a ShardTensor input");
  for_each_input_tensor(schema, args, [&](const at::Tensor& t, size_t i) {
    if (ShardTensorImpl* impl = shard_tensor_impl(t)) {
      TORCH_CHECK(impl->spec().mesh() == *mesh, meta.name, ": inputs are on different meshes (", *mesh, " vs ",
                  impl->spec().mesh(), "). All sharded inputs must share one mesh; redistribute one input first.");
      meta.inputs.push_back({impl->spec(), i, false});
      return;
    }
    TORCH_CHECK(t.numel() == 1 || implicit_replication_active(), meta.name, ": got a plain ", t.dim(), "-d tensor of shape [",
                join(t.sizes().vec(), ", "), "] (argument '", schema.arguments()[i].name(),
                "') next to ShardTensors while implicit replication is off (set_implicit_replication(false) or "
                "SHARDTENSOR_IMPLICIT_REPLICATION=0); only 0-d and single-element plain tensors count as Replicate. Wrap "
                "it with from_local() or distribute_tensor(), or open an ImplicitReplication scope "
                "(Python: st.implicit_replication()).");
    meta.inputs.push_back({ShardTensorSpec(*mesh, Placements(mesh->ndim(), Replicate()), t.sizes().vec(), t.scalar_type()), i, true});
  });

  meta.args = args;
  const Rule* rule = rule_registry().find(meta.name);
  if (rule) p->result = zigzag_aware_result(*rule, meta);
  if (!rule || !p->result.unsupported_reason.empty()) {
    const std::string why = rule ? "its sharding rule refuses inputs " + describe_args(meta) + ": " + p->result.unsupported_reason
                                 : "no sharding rule for this operator";
    // A gathered copy of a view would not alias its base: writes through it would be lost.
    for (const c10::Argument& ret : schema.returns())
      TORCH_CHECK(!ret.alias_info() || ret.alias_info()->isWrite(), meta.name, ": ", why,
                  ". It is a view operator, so it cannot fall back to computing on gathered inputs (the result "
                  "would not alias its input, and writes through it would be lost). Register a rule for '",
                  meta.name, "' with register_sharding_rule(), or use to_local() pieces.");
    // In-place operators that change their input's shape or strides cannot fall back either:
    // the gathered result has another shape than the tensor it would be written into.
    TORCH_CHECK(!changes_shape_in_place(meta.name), meta.name, ": ", why,
                ". It changes its input's shape in place, which a ShardTensor cannot do without a rule; use "
                "an out-of-place operator (x = x.as_strided(...) rather than x.as_strided_(...); x.reshape(...) "
                "rather than x.resize_(...)).");
    note_fallback(meta.name, why);
    p->result = fallback_result(meta);
    p->fallback = true;
  } else {
    note_propagated(meta.name);
  }
  if (p->result.kernel_plan) {  // lowered once, moves first: the propagation is cached with its kernel
    TORCH_INTERNAL_ASSERT(!p->result.local_kernel, meta.name, ": a rule sets both a local kernel and a kernel plan");
    p->kernel_moves = lower_moves(*p->result.kernel_plan);
    p->result.local_kernel = p->result.kernel_plan->lower(p->kernel_moves);
    p->piece_kernel = p->result.kernel_plan->lower_for_piece();
  }
  meta.args = {};  // the stack does not outlive this call
  for (const c10::IValue& arg : args) {
    const bool tensor = is_tensor_argument(arg);
    p->tensor_arguments.push_back(tensor);
    p->arguments.push_back(tensor ? c10::IValue() : arg);  // kept without tensors, which they would keep alive
  }

  TORCH_INTERNAL_ASSERT(p->result.input_targets.size() == meta.inputs.size(), meta.name, ": the rule gave ",
                        p->result.input_targets.size(), " input layouts for ", meta.inputs.size(), " inputs");
  for (size_t k = 0; k < meta.inputs.size(); ++k) {
    const ShardTensorSpec& from = meta.inputs[k].spec;
    const ShardTensorSpec& to = p->result.input_targets[k];
    p->plans.push_back(from == to ? nullptr : plan_redistribute(from, to));
  }
  p->output_specs.resize(p->result.outputs.size());
  p->direct = runs_on_local_pieces_alone(*p);
  p->plain_inputs = std::any_of(meta.inputs.begin(), meta.inputs.end(), [](const TensorInput& in) { return in.plain; });
  return p;
}

thread_local int propagation_runs = 0;  // PropagationRun's nesting on this thread

struct Cache {
  uint64_t generation = ~uint64_t{0};  // the rule registry's, when the entries were built
  uint64_t broken_groups = 0;          // broken_group_count() then: entries hold meshes
  std::unordered_map<uint64_t, std::unique_ptr<Propagation>> entries;
};

Cache& cache() {
  thread_local Cache c;
  return c;
}

}  // namespace

bool is_out_argument(const c10::FunctionSchema& schema, size_t i) {
  return i < schema.arguments().size() && schema.arguments()[i].is_out();
}

bool is_written_input(const c10::FunctionSchema& schema, size_t i) {
  if (i == 0 || i >= schema.arguments().size() || schema.arguments()[i].is_out()) return false;
  const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
  return alias && alias->isWrite();
}

namespace propagation_key {

uint64_t seed(const c10::FunctionSchema& schema) {
  return mix(reinterpret_cast<uintptr_t>(&schema), implicit_replication_active() * 2 + is_strict());
}

Propagation* entry_for(uint64_t key) {
  Cache& c = cache();
  const uint64_t generation = rule_registry().generation();
  const uint64_t broken_groups = broken_group_count();
  if (c.generation != generation || c.broken_groups != broken_groups) {
    // Every thread's cache sees a broken group at its next lookup, so the shared plan cache is
    // checked only then, not on every hit. Plans are shared: dropping them is safe during a run.
    drop_plans_after_broken_groups();
    if (propagation_runs == 0) {
      c.entries.clear();
      c.generation = generation;
      c.broken_groups = broken_groups;
    }
  }
  auto it = c.entries.find(key);
  return it == c.entries.end() ? nullptr : it->second.get();
}

}  // namespace propagation_key

// Plain inputs that require grad (plain weights beside sharded activations) get their leaves'
// gradient hook on every call, cached or not: one module's cached propagation serves the
// next module's weights too.
static void keep_plain_gradients(const Propagation& p, c10::ArrayRef<c10::IValue> args) {
  if (p.plain_inputs) for_each_input_tensor(*p.meta.schema, args, [](const at::Tensor& t, size_t) { keep_gradient_plain(t); });
}

// A propagation made: the operator, each input's layout and the one it runs in, the outputs'.
static void log_miss(const Propagation& p) {
  std::ostringstream os;
  os << "propagation miss: " << p.meta.name << (p.fallback ? " (fallback: gathers its inputs)" : "") << ":";
  for (size_t k = 0; k < p.meta.inputs.size(); ++k) {
    os << " " << p.meta.inputs[k].spec.to_string();
    if (p.plans[k]) os << " -> " << p.result.input_targets[k].to_string();
  }
  os << " =>";
  for (const OutputLayout& out : p.result.outputs) os << " " << to_string(out.placements);
  log_line(LogLevel::Debug, os.str());
}

Propagation& propagate(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const c10::FunctionSchema& schema = op.schema();
  uint64_t key = propagation_key::seed(schema);
  for (size_t i = 0; i < args.size(); ++i)
    key = propagation_key::mix(key, is_out_argument(schema, i) ? propagation_key::kOutArgumentHash : hash_argument(args[i]));

  Propagation* cached = propagation_key::entry_for(key);
  if (cached && matches(*cached, schema, args)) {
    keep_plain_gradients(*cached, args);
    return *cached;
  }
  std::unique_ptr<Propagation> built = build(op, args);
  if (debug_log_enabled()) log_miss(*built);
  Propagation& ref = *built;
  cache().entries[key] = std::move(built);
  keep_plain_gradients(ref, args);
  return ref;
}

void clear_propagation_cache() { cache().entries.clear(); }

PropagationRun::PropagationRun() { ++propagation_runs; }
PropagationRun::~PropagationRun() { --propagation_runs; }

void drop_plans_after_broken_groups() {
  static std::atomic<uint64_t> seen{0};
  uint64_t before = seen.load(std::memory_order_relaxed);
  const uint64_t now = broken_group_count();
  if (now != before && seen.compare_exchange_strong(before, now)) clear_plan_cache();
}

}  // namespace shardtensor

namespace shardtensor {

void release_cached_layouts() {
  clear_propagation_cache();  // this thread's; other threads' entries go when those threads end
  clear_plan_cache();
}

}  // namespace shardtensor
