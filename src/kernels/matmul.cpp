// addmm/baddbmm with a Partial(sum) product: the kernel of BiasOncePlan (rules/matmul.h).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros.h>

#include "rules/matmul.h"

namespace shardtensor {

LocalKernel BiasOncePlan::lower() const {
  return [mesh = mesh, dims = partial_mesh_dims](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    bool adds_bias = true;
    for (int64_t m : dims) adds_bias = adds_bias && mesh.coordinate()[m] == 0;
    // Not beta = 0: libtorch 1.13's CPU baddbmm then skips copying self into its fresh result
    // but still scales that uninitialised result by beta (NaN * 0 = NaN). A zero bias is safe.
    c10::IValue& bias = (*stack)[stack->size() - 5];
    if (!adds_bias) bias = at::zeros({}, bias.toTensor().options());
    op.callBoxed(stack);
  };
}

}  // namespace shardtensor
