// Controlling how ATen operators run on ShardTensors: strict mode, implicit replication,
// custom sharding rules, local_map and the debug tools.
//
//   shardtensor::set_strict(true);          // or SHARDTENSOR_STRICT=1: no silent fallback
//   y = x + plain_bias;                     // plain tensors count as Replicate (implicit replication)
//   shardtensor::CommDebugMode comms;  ...;  std::cout << comms.table();
//   SHARDTENSOR_LOG=1                       // one line per operator: placements in, moves, out
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "shardtensor/placement.h"

namespace shardtensor {

// ---- Fallback policy -------------------------------------------------------------------
// An operator without a sharding rule runs on gathered (Replicate) inputs and returns
// Replicate outputs, with a one-time warning naming it. In strict mode it raises instead.
// Strict mode starts on when the environment variable SHARDTENSOR_STRICT is 1.
void set_strict(bool strict);
bool is_strict();

// Operators that took the fallback path so far in this process (for tests and reports).
std::vector<std::string> fallback_operators();
// Operators that ran through their sharding rule so far in this process.
std::vector<std::string> propagated_operators();

// Drops every cached propagation and redistribute plan, and with them the references they
// hold to meshes and their communicators. For shutdown (Python calls it at exit, so that
// process groups are destroyed while the interpreter and c10d are still alive); call it only
// while no operator runs. Later operators simply rebuild their cache entries. (After a process
// group broke, the caches let go of their meshes by themselves.)
void release_cached_layouts();

// ---- Registration ------------------------------------------------------------------------
// Registers ShardTensor's kernels with libtorch's dispatcher, which otherwise happens when the
// first ShardTensor is made. libtorch's dispatch reads its tables without a lock while
// registration writes them in place (OperatorEntry::lookup), so a program that runs
// operators on several threads (a DataLoader's pin-memory thread, say) calls this before it
// starts them. The Python package calls it on import, while it holds the GIL. Idempotent.
void register_kernels();

// ---- Implicit replication ----------------------------------------------------------------
// A plain tensor next to ShardTensors counts as Replicate on their mesh, as in PhysicsNeMo:
// each rank must then hold the same value (plain weights beside sharded activations). Its
// gradient stays plain: a plain tensor that requires grad gets, on its autograd leaf, a hook
// that turns the gradient autograd has summed over every use into the full value, one
// reduction per leaf per backward over the mesh dims the activations are sharded or partial on.
//
// set_implicit_replication(false) (or SHARDTENSOR_IMPLICIT_REPLICATION=0) restores DTensor's
// refusal: plain tensors other than 0-d and single-element ones are then an error, except
// inside an ImplicitReplication scope (per thread) and while autograd runs a backward pass,
// where plain tensors come from libtorch's own formulas (zeros for an unused split piece).
void set_implicit_replication(bool enabled);
bool is_implicit_replication();

class ImplicitReplication {
 public:
  ImplicitReplication();
  ~ImplicitReplication();
  ImplicitReplication(const ImplicitReplication&) = delete;
  ImplicitReplication& operator=(const ImplicitReplication&) = delete;

 private:
  bool previous_;
};

// For a data-parallel wrapper that sums gradients over the whole mesh in its own buckets (torch's
// DDP with shardtensor.parallel.sum_gradients_with_ddp in Python): from now on the hook on the
// plain parameter `leaf` hands on, with no message, this rank's term of a sum over the `ranks`
// ranks of the activations' mesh (a Partial(sum) gradient's local term; any other gradient, a
// plain one computed alike on every rank included, divided by `ranks`). The wrapper's one sum
// over all ranks then gives the full gradient; until it runs, `.grad` holds this rank's term.
void hand_on_gradient_terms(const at::Tensor& leaf, int64_t ranks);

// ---- local_map ---------------------------------------------------------------------------
// Runs `fn` on local tensors. Each input ShardTensor is first redistributed to its entry of
// `in_placements` (std::nullopt: used as it is), `fn` sees the local pieces, and its outputs are
// wrapped with `out_placements` on the inputs' mesh, their shard sizes inferred from the local
// outputs (one all-gather of shapes per output, so uneven outputs work). Differentiable.
using LocalFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& locals)>;
std::vector<at::Tensor> local_map(const LocalFunction& fn, const std::vector<at::Tensor>& inputs,
                                  const std::vector<std::optional<Placements>>& in_placements,
                                  const std::vector<Placements>& out_placements);

// ---- Debug tools ---------------------------------------------------------------------------
// What a call of `op_name` ("aten::convolution", "aten::add.Tensor") on `args` would do,
// without running it: each input's redistribution (or none), the local kernel with every move
// it makes in the middle of the op (halo gathers and scatter-adds, reductions), and the output
// layouts. Tensor arguments are ShardTensors; missing trailing arguments take the schema's
// defaults. Nothing is communicated, and the propagation is cached for the real call.
std::string explain_operator(const std::string& op_name, std::vector<c10::IValue> args);

// Counts the collectives shardtensor issues on this thread while alive, by kind
// ("all_reduce", "all_to_all", ...) and by the operator that caused them ("aten::mm", or
// "redistribute" for explicit calls).
class CommDebugMode {
 public:
  CommDebugMode();
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  int64_t total() const;
  int64_t count(const std::string& kind) const;
  const std::map<std::string, int64_t>& counts() const { return by_kind_; }
  const std::map<std::string, std::map<std::string, int64_t>>& counts_by_operator() const { return by_operator_; }
  // Bytes this rank sent to other ranks (all-to-all parts for itself excluded; an all-reduce,
  // all-gather or broadcast counts its buffer once).
  int64_t bytes() const { return bytes_; }
  int64_t bytes(const std::string& kind) const;
  std::string table() const;  // one row per operator and collective kind

  // Called by the comm layer; public so that it needs no friend.
  // `counts`: false adds bytes to a collective already counted (a second phase of it).
  void record(const std::string& kind, const std::string& op, int64_t bytes = 0, bool counts = true);

 private:
  std::map<std::string, int64_t> by_kind_;
  std::map<std::string, std::map<std::string, int64_t>> by_operator_;
  std::map<std::string, int64_t> bytes_by_kind_;
  int64_t bytes_ = 0;
  CommDebugMode* previous_;
};

}  // namespace shardtensor
