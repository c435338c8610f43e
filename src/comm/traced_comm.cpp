// See traced_comm.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/traced_comm.h"

#include <ATen/core/Tensor.h>

#include <utility>

#include "mesh/mesh_impl.h"

namespace shardtensor {

TracedComm::TracedComm(Comm& eager, TracedCollectives collectives)
    : Comm(eager.number()), eager_(eager), collectives_(std::move(collectives)) {}

void TracedComm::all_gather(const at::Tensor& input, const at::Tensor& output) {
  output.copy_(collectives_.all_gather(input.reshape({1, -1})).view(output.sizes()));
}

void TracedComm::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  output.copy_(collectives_.reduce_scatter(input.view({size(), -1}), op).view(output.sizes()));
}

void TracedComm::all_reduce(const at::Tensor& tensor, ReduceOp op) { tensor.copy_(collectives_.all_reduce(tensor, op)); }

void TracedComm::broadcast(const at::Tensor& tensor, int64_t root) { tensor.copy_(collectives_.broadcast(tensor, root)); }

void TracedComm::all_to_all(const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                            const std::vector<int64_t>& input_splits) {
  output.copy_(collectives_.all_to_all(input, output_splits, input_splits));
}

Comm& comm_for_this_thread(Comm& comm) {
  if (!tracing_collectives()) return comm;
  Comm* traced = comm.traced_form();
  return traced ? *traced : comm;
}

namespace {
// DeviceMesh::comm hands out comm_for_this_thread's choice (mesh/ is below comm/, so it is told).
const bool handing_out = (set_comm_hand_out(&comm_for_this_thread), true);
}  // namespace

}  // namespace shardtensor
