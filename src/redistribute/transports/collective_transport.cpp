// See collective_transport.h. Equal-piece steps go with no copy where the gathered or
// scattered dim is the outermost one that is not 1.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "redistribute/transports/collective_transport.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "comm/comm.h"
#include "redistribute/transports/posted_parts.h"

namespace shardtensor {
namespace {

// Whether a contiguous tensor of `shape` is size() blocks in the order of `dim`: true when
// every dim before it has extent 1.
bool outermost(c10::IntArrayRef shape, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d)
    if (shape[d] != 1) return false;
  return true;
}

// `shape` with `dim` split into (n, shape[dim] / n).
std::vector<int64_t> split_dim(c10::IntArrayRef shape, int64_t dim, int64_t n) {
  std::vector<int64_t> split = shape.vec();
  split[dim] /= n;
  split.insert(split.begin() + dim, n);
  return split;
}

}  // namespace

// The parts posted on a batch that one all_to_all with split sizes carries at wait(): what
// NCCL needs, and what SHARDTENSOR_TRANSPORT=collectives asks for on Gloo.
const PartTransport& all_to_all_transport() {
  static const PostedPartsTransport transport(&Comm::start_all_to_all);
  return transport;
}

at::Tensor gather_equal_pieces(Comm& comm, const at::Tensor& local, int64_t tensor_dim) {
  const int64_t n = comm.size();
  const at::Tensor piece = local.contiguous();
  std::vector<int64_t> joined = piece.sizes().vec();
  joined[tensor_dim] *= n;
  at::Tensor out = at::empty(joined, piece.options());
  // Equal pieces: all empty or none. Gloo divides by the element count (SIGFPE on 1.13).
  if (piece.numel() == 0) return out;
  std::vector<int64_t> stack_shape = piece.sizes().vec();
  stack_shape.insert(stack_shape.begin(), n);
  if (outermost(joined, tensor_dim)) {
    comm.all_gather(piece, out.view(stack_shape));
    return out;
  }
  at::Tensor stack = at::empty(stack_shape, piece.options());
  comm.all_gather(piece, stack);
  out.view(split_dim(joined, tensor_dim, n)).copy_(stack.movedim(0, tensor_dim));
  return out;
}

at::Tensor reduce_scatter_equal_pieces(Comm& comm, const at::Tensor& local, int64_t tensor_dim, ReduceOp op) {
  const int64_t n = comm.size();
  std::vector<int64_t> mine = local.sizes().vec();
  mine[tensor_dim] /= n;
  at::Tensor out = at::empty(mine, local.options());
  if (out.numel() == 0) return out;  // equal pieces: empty on every member alike
  const at::Tensor blocks = outermost(local.sizes(), tensor_dim)
                                ? local.contiguous()
                                : local.reshape(split_dim(local.sizes(), tensor_dim, n)).movedim(tensor_dim, 0).contiguous();
  comm.reduce_scatter(out, blocks, op);
  return out;
}

}  // namespace shardtensor
