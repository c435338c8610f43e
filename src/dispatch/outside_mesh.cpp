// See outside_mesh.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "dispatch/outside_mesh.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>

#include "dispatch/shard_tensor_impl.h"
#include "redistribute/executor.h"
#include "rules/kernel_plan.h"
#include "util/counter_random.h"
#include "util/strings.h"

namespace shardtensor {

// A ShardTensor's sizes and strides are global ones.
at::Tensor meta_stand_in(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta).requires_grad(false));
}

void run_outside_mesh(const c10::OperatorHandle& op, torch::jit::Stack* stack, const Propagation& p) {
  const DeviceMesh& mesh = p.meta.mesh();
  const std::string where = " on global rank " + std::to_string(mesh.rank()) + ", which is outside " + mesh.to_string() +
                            " (ranks [" + join(mesh.ranks(), ", ") + "])";
  for (const c10::Argument& ret : op.schema().returns()) {
    const c10::TypePtr& type = ret.type();
    TORCH_CHECK(type->kind() == c10::TypeKind::TensorType || type->isSubtypeOf(*c10::ListType::ofTensors()) ||
                    type->isSubtypeOf(*c10::OptionalType::ofTensor()),
                p.meta.name, where, ": the op returns a ", type->str(),
                ", which needs the tensor's values, and this rank holds none. Ranks outside a mesh hold no shard of ",
                "its tensors; read values on the mesh's ranks only.");
  }
  try {
    op.callBoxed(stack);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, p.meta.name, where, ": a rank outside the mesh works out the op's global output shapes on the "
                "meta device, and that failed: ", e.what_without_backtrace());
  }
  if (p.result.kernel_plan)
    for (int64_t k = p.result.kernel_plan->random_keys_drawn(p.arguments); k > 0; --k) next_random_key();
}

at::Tensor wrap_output_outside_mesh(const Propagation& p, const OutputLayout& layout, const at::Tensor& global) {
  const DeviceMesh& mesh = p.meta.mesh();
  ShardTensorSpec spec(mesh, layout.placements, global.sizes().vec(), global.scalar_type(), layout.sizes);
  at::Tensor piece = piece_outside_mesh(spec, global.options().device(mesh.device()));
  return make_shard_tensor(std::move(piece), std::move(spec));
}

}  // namespace shardtensor
