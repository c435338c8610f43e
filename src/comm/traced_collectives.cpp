// See traced_collectives.h. The functional ops are found by name at the first call: torch 1.x
// has none, and a build on it raises here, naming the torch it needs.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/traced_collectives.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <utility>

namespace shardtensor {
namespace {

thread_local bool tracing = false;

const char* functional_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Product: return "product";
    case ReduceOp::Norm: break;  // reaches the transports only as a sum of powers
  }
  TORCH_INTERNAL_ASSERT(false, "a reduction without a functional collective");
}

// Calls _c10d_functional::`op` on `arguments` and waits for its result, as
// torch.distributed._functional_collectives does (the wait is a node of the graph too).
at::Tensor call_and_wait(const char* op, std::vector<c10::IValue> arguments) {
  const auto find = [](const std::string& name) {
    auto handle = c10::Dispatcher::singleton().findSchema({name, ""});
    TORCH_CHECK(handle, "shardtensor: tracing a ShardTensor's collectives needs torch's functional collectives (", name,
                "), which this torch lacks; torch.compile on ShardTensors needs torch 2.x with torch.distributed.");
    return *handle;
  };
  torch::jit::Stack stack(std::move(arguments));
  find(std::string("_c10d_functional::") + op).callBoxed(stack);
  static const c10::OperatorHandle wait = find("_c10d_functional::wait_tensor");
  at::Tensor started = stack.at(0).toTensor();
  stack.clear();
  stack.emplace_back(std::move(started));
  wait.callBoxed(stack);
  return stack.at(0).toTensor();
}

}  // namespace

bool tracing_collectives() { return tracing; }

TracingScope::TracingScope() : previous_(tracing) { tracing = true; }
TracingScope::~TracingScope() { tracing = previous_; }

TracingPause::TracingPause() : previous_(tracing) { tracing = false; }
TracingPause::~TracingPause() { tracing = previous_; }

TracedCollectives::TracedCollectives(std::string group_name, int64_t group_size, std::string described_as)
    : group_name_(std::move(group_name)), group_size_(group_size), described_as_(std::move(described_as)) {}

const std::string& TracedCollectives::name() const {
  TORCH_CHECK(!group_name_.empty(), "shardtensor: torch.compile cannot trace a collective on ", described_as_,
              ": its process group was not made by torch.distributed (a DeviceMesh built in C++), so torch's functional "
              "collectives cannot name it. Build the mesh in Python (shardtensor.init_device_mesh or DeviceMesh), or "
              "leave this region uncompiled.");
  return group_name_;
}

at::Tensor TracedCollectives::all_reduce(const at::Tensor& input, ReduceOp op) const {
  // Gloo has no average: a sum, then a division, as the eager path does it.
  at::Tensor out = call_and_wait("all_reduce", {input.contiguous(), functional_name(op == ReduceOp::Avg ? ReduceOp::Sum : op), name()});
  return op == ReduceOp::Avg ? out.div(group_size_) : out;
}

at::Tensor TracedCollectives::all_gather(const at::Tensor& input) const {
  return call_and_wait("all_gather_into_tensor", {input.contiguous(), group_size_, name()});
}

at::Tensor TracedCollectives::reduce_scatter(const at::Tensor& input, ReduceOp op) const {
  at::Tensor out = call_and_wait("reduce_scatter_tensor",
                                 {input.contiguous(), std::string(functional_name(op == ReduceOp::Avg ? ReduceOp::Sum : op)),
                                  group_size_, name()});
  return op == ReduceOp::Avg ? out.div(group_size_) : out;
}

at::Tensor TracedCollectives::all_to_all(const at::Tensor& input, const std::vector<int64_t>& output_splits,
                                         const std::vector<int64_t>& input_splits) const {
  return call_and_wait("all_to_all_single", {input.contiguous(), output_splits, input_splits, name()});
}

at::Tensor TracedCollectives::broadcast(const at::Tensor& input, int64_t root) const {
  return call_and_wait("broadcast", {input.contiguous(), root, name()});
}

}  // namespace shardtensor
