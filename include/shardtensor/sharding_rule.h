// Sharding rules: what they see, what they return, and how to add your own.
//
// A rule is a pure function over metadata: it sees the operator name, its non-tensor
// arguments and the specs of its tensor inputs, never tensor data, never the rank. It returns
// the layout each input must have when the op runs and the layout of every tensor output.
// Because it sees the same metadata on every rank, every rank plans the same collectives.
//
// Outputs are described by placements and shard-size tables only; the kernel takes each
// output's global shape and dtype from the local result (unsharded dims are whole locally,
// sharded dims add up their table) and checks that the local piece has the size the table
// promises. So rules never compute shapes they do not reason about, and a wrong table fails
// loudly instead of wrapping a wrong answer.
//
// Registering a rule for an operator (an ATen one, or a custom one from TORCH_LIBRARY):
//
//   shardtensor::register_sharding_rule("mylib::scale", [](const shardtensor::OpMeta& op) {
//     shardtensor::RuleResult r;
//     r.input_targets = {op.inputs[0].spec};               // runs on any layout, no move
//     r.outputs = {shardtensor::layout_of(op.inputs[0].spec)};
//     return r;
//   });
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtensor/spec.h"

namespace c10 {
class OperatorHandle;
}

namespace shardtensor {

struct KernelPlan;  // src/rules/kernel_plan.h: how the built-in rules declare their local kernels

// One tensor argument: a ShardTensor, or a plain tensor taken as Replicate (0-d and
// single-element tensors always; others inside an implicit-replication scope).
struct TensorInput {
  ShardTensorSpec spec;
  size_t arg_index;     // position in the schema's arguments
  bool plain = false;   // not a ShardTensor
};

struct OpMeta {
  std::string name;                          // "aten::add.Tensor"
  const c10::FunctionSchema* schema = nullptr;
  std::vector<TensorInput> inputs;           // tensor arguments in order (lists flattened)
  c10::ArrayRef<c10::IValue> args;           // all arguments; tensors already unwrapped

  // Arguments by their schema names ("dim", "keepdim", "weight"): a rule that serves several
  // overloads reads the same name wherever each one puts it, and a rule can't read the wrong
  // argument silently. Names are the same on every libtorch line we build against.
  //
  // The position of argument `name` in the schema; raises, naming the operator and listing its
  // arguments, when the schema has no argument of that name.
  size_t arg_index(const std::string& name) const;
  // Whether the schema has an argument `name` (a rule serving overloads that differ in it).
  bool has_arg(const std::string& name) const;
  // Argument `name` (tensors already unwrapped); raises like arg_index.
  const c10::IValue& arg(const std::string& name) const;
  // The input that came from argument `name` (nullptr: None or not a tensor; the first
  // tensor of a list argument); raises like arg_index.
  const TensorInput* input_named(const std::string& name) const;
  // A position is no name: arg(0) would otherwise compile, as a null std::string.
  const c10::IValue& arg(size_t) const = delete;
  const TensorInput* input_named(size_t) const = delete;

  // The input that came from argument `arg_index` (nullptr: None or not a tensor).
  const TensorInput* input_at(size_t arg_index) const;
  int64_t input_position(size_t arg_index) const;  // its index in `inputs`, or -1
  const DeviceMesh& mesh() const { return inputs.front().spec.mesh(); }
  bool is_inplace() const;  // the first argument is written to (add_, copy_, fill_)
};

// The layout of one output: placements per mesh dim, and a size table for every tensor dim
// the placements shard (taken from an input: output sizes are derived, never communicated).
struct OutputLayout {
  Placements placements;
  ShardSizes sizes;
};

// Runs the operator's local computation when a rule needs more than calling the operator on
// the local pieces (a mean over a sharded dim divides by the global count, an addmm whose
// product is Partial adds its bias once). Gets the operator and the unwrapped stack, leaves
// the outputs on it like the operator would.
using LocalKernel = std::function<void(const c10::OperatorHandle& op, torch::jit::Stack* stack)>;

struct RuleResult {
  std::vector<ShardTensorSpec> input_targets;  // one per input, in the order of OpMeta::inputs
  std::vector<OutputLayout> outputs;           // one per tensor output
  LocalKernel local_kernel;                    // empty: call the operator itself
  // The built-in rules' form of local_kernel: a declared plan, lowered into one when the
  // propagation is cached. A rule sets at most one of the two.
  std::shared_ptr<const KernelPlan> kernel_plan;
  std::string unsupported_reason;              // non-empty: the rule refuses this call

  static RuleResult unsupported(std::string reason);
};

using Rule = std::function<RuleResult(const OpMeta&)>;

// Adds or replaces the rule of `op_name` ("aten::add.Tensor", "mylib::scale"; the overload
// after the dot, none for the default overload). Takes effect for the next call: cached
// propagation results are dropped.
void register_sharding_rule(const std::string& op_name, Rule rule);

// DTensor's register_sharding: instead of a rule, the shardings an operator accepts on one mesh
// dim, and the library picks. `outputs` has a placement per tensor output; `inputs` a placement
// per argument of the schema in order (std::nullopt for non-tensor arguments and absent optional
// tensors), or just one per tensor input. On a propagation miss the library combines one
// acceptable sharding per mesh dim, costs each combination by what its inputs' redistributions
// would move (redistribute's cost model), and takes the cheapest; among equals the one listed
// first. Output piece sizes come from the input sharded by the same mesh dims. A combination
// that would move the written argument of an in-place operator is never taken.
//
//   shardtensor::register_sharding("aten::_softmax", [](const shardtensor::OpMeta& op) {
//     const int64_t dim = op.arg("dim").toInt();
//     std::vector<shardtensor::AcceptableSharding> ok{{{Replicate()}, {Replicate(), std::nullopt, std::nullopt}}};
//     for (int64_t d = 0; d < op.inputs[0].spec.ndim(); ++d)
//       if (d != dim) ok.push_back({{Shard(d)}, {Shard(d), std::nullopt, std::nullopt}});
//     return ok;
//   });
struct AcceptableSharding {
  std::vector<std::optional<Placement>> outputs;
  std::vector<std::optional<Placement>> inputs;
};
using ShardingStrategy = std::function<std::vector<AcceptableSharding>(const OpMeta&)>;
void register_sharding(const std::string& op_name, ShardingStrategy strategy);

// Operators that have a rule, sorted.
std::vector<std::string> sharding_rule_names();

// The layout of `spec` as an output (the common case of an op that keeps its input's layout).
OutputLayout layout_of(const ShardTensorSpec& spec);

}  // namespace shardtensor
