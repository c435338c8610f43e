// Sharding propagation for one operator call, and its cache.
//
// A Propagation is everything the kernel needs to run a call whose inputs have given specs:
// the target layout of every input with its (cached) redistribute plan, the output layouts,
// and the output specs once known. It is built once per (operator, input specs, non-tensor
// arguments) and reused: a cache hit costs a hash over the arguments, then a comparison of
// every input spec and every non-tensor argument with the ones it was built for (a hash alone
// could let two calls collide and run one with the other's layouts). The direct kernels look
// their hits up from the unboxed arguments with the same key (propagation_key.h).
#pragma once

#include <ATen/core/stack.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "domain/kernel_moves.h"
#include "redistribute/plan.h"
#include "shardtensor/sharding_rule.h"

namespace c10 {
class OperatorHandle;
}

namespace shardtensor {

// An output spec and this rank's local shape under it (compared on every hit, so kept).
struct CachedOutput {
  ShardTensorSpec spec;
  std::vector<int64_t> local_shape;
};

struct Propagation {
  OpMeta meta;                                  // name, inputs' specs and positions (args not kept)
  std::vector<c10::IValue> arguments;           // the non-tensor arguments built for; tensors as None
  std::vector<bool> tensor_arguments;           // which arguments are tensors (or tensor lists)
  RuleResult result;
  // The moves the rule's kernel plan declares, lowered once (the kernel holds a copy; explain
  // prints these). Empty without a plan.
  KernelMoves kernel_moves;
  std::vector<std::shared_ptr<const RedistributePlan>> plans;  // per input; null: already in place
  std::vector<std::optional<CachedOutput>> output_specs;  // filled on the first run
  bool fallback = false;                        // gathered inputs, Replicate outputs
  bool permutes_dims = false;                   // t, transpose, permute: strides follow (kernel.cpp)
  bool plain_inputs = false;                    // a plain tensor counts as Replicate (plain_gradients.h)
  // The call needs nothing but the operator (or the rule's kernel, if it moves nothing) on the
  // local pieces: no input moves, no written argument, this rank in the mesh, one tensor
  // output, no SHARDTENSOR_LOG. Such a call may skip the boxed kernel (dispatch/direct_kernel.h).
  bool direct = false;
  // The rule's kernel as a function of the first argument's piece, where it is one (views).
  std::function<at::Tensor(const at::Tensor& piece)> piece_kernel;
};

// Argument `i` of the call is an out= tensor (keyword-only and written, torchgen's out= form):
// not a rule input; the result is written into it.
bool is_out_argument(const c10::FunctionSchema& schema, size_t i);

// Argument `i` is an input the op also writes, other than self and out= (batch norm's running
// statistics, a fused optimizer's state): the rule sees it like any input, and where it ran
// moved to another layout the kernel writes the moved copy back into the caller's tensor.
bool is_written_input(const c10::FunctionSchema& schema, size_t i);

// The cached propagation of the call on `args` (ShardTensors still wrapped), built on a miss.
// Checks the inputs first: plain tensors, mixed meshes, strict mode.
Propagation& propagate(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args);

// Drops every cached propagation (a rule was added or replaced).
void clear_propagation_cache();

// Held while a cached propagation runs on this thread (its kernel may call operators on
// ShardTensors): until the outermost run ends, lookups keep every entry of the thread's cache,
// and the drop that a rule change or a broken group asks for waits for the next lookup outside
// any run, so that an operator a kernel calls never frees its caller's propagation.
class PropagationRun {
 public:
  PropagationRun();
  ~PropagationRun();
  PropagationRun(const PropagationRun&) = delete;
  PropagationRun& operator=(const PropagationRun&) = delete;
};

// Cached propagations and plans hold meshes, and with them their process groups: once a group
// broke (comm.h: broken_group_count), the layout caches let go of them, so that a broken
// group's process group closes when the program drops its meshes. The plan cache is dropped
// here, at the first call of any thread after a group broke (a propagation lookup that finds
// its cache stale, or a redistribution; two atomic loads otherwise); each thread's propagations
// at its next lookup. Plans are shared: one that another thread runs lives on.
void drop_plans_after_broken_groups();

namespace propagation_key {
// The cached propagation under `key` (propagation_key.h), after dropping the cache if rules
// changed or a group broke; nullptr when none.
Propagation* entry_for(uint64_t key);
}  // namespace propagation_key

}  // namespace shardtensor
