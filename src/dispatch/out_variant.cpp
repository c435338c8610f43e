// See out_variant.h.
#include "dispatch/out_variant.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include <mutex>
#include <unordered_map>

#include "dispatch/op_name.h"
#include "dispatch/propagation.h"
#include "dispatch/shard_tensor_impl.h"
#include "redistribute/executor.h"
#include "redistribute/plan.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// torchgen puts out= arguments last, keyword-only, so the last argument tells: one check per
// call on the hot path, not a scan of the schema.
bool has_out_arguments(const c10::FunctionSchema& schema) {
  return !schema.arguments().empty() && is_out_argument(schema, schema.arguments().size() - 1);
}

// `candidate` computes what out= overload `op` writes: it writes nothing itself, returns one
// tensor per out= argument, and takes exactly op's other arguments (names and types).
bool is_functional_form(const c10::FunctionSchema& op, const c10::FunctionSchema& candidate) {
  if (candidate.is_mutable()) return false;
  std::vector<const c10::Argument*> inputs;
  size_t outs = 0;
  for (size_t i = 0; i < op.arguments().size(); ++i) {
    if (is_out_argument(op, i)) {
      ++outs;
    } else {
      inputs.push_back(&op.arguments()[i]);
    }
  }
  if (candidate.returns().size() != outs || candidate.arguments().size() != inputs.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::Argument& a = candidate.arguments()[i];
    if (a.name() != inputs[i]->name() || *a.type() != *inputs[i]->type()) return false;
  }
  for (const c10::Argument& r : candidate.returns())
    if (r.alias_info() || !r.type()->isSubtypeOf(*c10::TensorType::get())) return false;
  return true;
}

const c10::OperatorHandle* find_functional(const c10::OperatorHandle& op) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name != op.operator_name().name) continue;
    auto candidate = dispatcher.findOp(name);
    if (candidate && candidate->hasSchema() && is_functional_form(op.schema(), candidate->schema()))
      return new c10::OperatorHandle(*candidate);  // lives as long as the dispatcher's table
  }
  return nullptr;
}

// A plain out= tensor beside ShardTensor inputs is a composite's own buffer (linalg.matrix_rank
// sums into an at::empty, chunked linear_cross_entropy multiplies into one): torch made it from
// the input's options, which carry no layout. A plain tensor stands for the whole tensor (as a
// plain input does under implicit replication), so it gets the whole result, resized as torch
// resizes an out= tensor; the composite then goes on with it as with any plain tensor.
void write_whole(const std::string& op_name, const at::Tensor& out, const ShardTensorImpl& result) {
  TORCH_CHECK(c10::canCast(result.spec().dtype(), out.scalar_type()), op_name, ": result type ", result.spec().dtype(),
              " can't be cast to the desired output type ", out.scalar_type(), " of the out= tensor");
  const ShardTensorSpec& from = result.spec();
  const ShardTensorSpec whole(from.mesh(), Placements(from.mesh().ndim(), Replicate()), from.shape(), from.dtype());
  at::Tensor gathered = from == whole ? result.local() : execute_redistribute(result.local(), from, *plan_redistribute(from, whole));
  at::Tensor plain = out;
  if (!plain.sizes().equals(gathered.sizes())) plain.resize_(gathered.sizes());
  plain.copy_(gathered);
}

// Writes `result` (the functional overload's output) into the caller's out= tensor.
void write_out(const std::string& op_name, const at::Tensor& out, at::Tensor result) {
  ShardTensorImpl* target = shard_tensor_impl(out);
  ShardTensorImpl* source = shard_tensor_impl(result);
  if (!target && source) return write_whole(op_name, out, *source);
  TORCH_CHECK(target && source, op_name, ": the out= tensor is a ", target ? "ShardTensor" : "plain tensor",
              " but the result is a ", source ? "ShardTensor" : "plain tensor",
              "; pass a ShardTensor out= tensor with ShardTensor inputs (empty_like(input) makes one), or plain "
              "tensors for both");
  TORCH_CHECK(c10::canCast(result.scalar_type(), out.scalar_type()), op_name, ": result type ", result.scalar_type(),
              " can't be cast to the desired output type ", out.scalar_type(), " of the out= tensor");
  TORCH_CHECK(target->spec().mesh() == source->spec().mesh(), op_name, ": the out= tensor is on mesh ",
              target->spec().mesh(), " but the inputs are on ", source->spec().mesh(),
              "; give an out= tensor on the inputs' mesh");
  if (result.scalar_type() != out.scalar_type()) {
    result = result.to(out.scalar_type());
    source = shard_tensor_impl(result);
  }
  const ShardTensorSpec& from = source->spec();
  const ShardTensorSpec& home = target->spec();
  if (from.shape() != home.shape()) {  // torch resizes the out= tensor: it takes the result's layout
    target->replace(source->local(), from);
    return;
  }
  at::Tensor local = target->local();
  if (from == home) {
    local.copy_(source->local());
  } else {
    local.copy_(execute_redistribute(source->local(), from, *plan_redistribute(from, home)));
  }
}

}  // namespace

const c10::OperatorHandle* functional_overload_of(const c10::OperatorHandle& op) {
  if (!has_out_arguments(op.schema())) return nullptr;  // most calls: no lock taken
  static std::mutex mutex;
  static std::unordered_map<const c10::FunctionSchema*, const c10::OperatorHandle*> found;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = found.find(&op.schema());
  if (it == found.end()) it = found.emplace(&op.schema(), find_functional(op)).first;
  return it->second;
}

void run_out_variant(const c10::OperatorHandle& op, const c10::OperatorHandle& functional, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t args_begin = stack->size() - num_args;
  torch::jit::Stack call;
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& arg = (*stack)[args_begin + i];
    if (is_out_argument(schema, i)) {
      outs.push_back(arg.toTensor());
    } else {
      call.push_back(std::move(arg));
    }
  }
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(args_begin), stack->end());
  functional.callBoxed(&call);  // through the kernel again, with the functional overload's rule
  const std::string name = full_op_name(op.operator_name());
  for (size_t j = 0; j < outs.size(); ++j) {
    write_out(name, outs[j], call[j].toTensor());
    stack->push_back(outs[j]);
  }
}

}  // namespace shardtensor
