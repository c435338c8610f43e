// See mesh_collectives.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/mesh_collectives.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "comm/comm.h"

namespace shardtensor {

at::Tensor all_gather_over_mesh(const DeviceMesh& mesh, const at::Tensor& input) {
  // block holds the contributions of the coordinates gathered so far: after gathering mesh
  // dims d..n-1 it is [size(d), ..., size(n-1), *input.shape].
  at::Tensor block = input.contiguous();
  for (int64_t d = mesh.ndim() - 1; d >= 0; --d) {
    std::vector<int64_t> shape = block.sizes().vec();
    shape.insert(shape.begin(), mesh.size(d));
    at::Tensor gathered = at::empty(shape, block.options());
    mesh.comm(d).all_gather(block, gathered);
    block = gathered;
  }
  std::vector<int64_t> flat_shape = input.sizes().vec();
  flat_shape.insert(flat_shape.begin(), mesh.size());
  return block.reshape(flat_shape);
}

}  // namespace shardtensor
