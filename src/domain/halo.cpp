// See halo.h. The moves themselves are LoweredStep's (redistribute/executor_halo.cpp).
#include "domain/halo.h"

#include <memory>

#include "redistribute/executor.h"
#include "rules/kernel_plan.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

std::string described(const std::vector<MoveStep>& steps) {
  std::vector<std::string> names;
  for (const MoveStep& step : steps) names.push_back(to_string(step));
  return join(names, ", ");
}

}  // namespace

HaloAxisSteps::HaloAxisSteps(const HaloAxis& axis, const DeviceMesh& mesh, double fill)
    : HaloAxisSteps(std::make_shared<const LoweredHaloAxis>(axis, mesh), fill) {}

HaloAxisSteps::HaloAxisSteps(const std::shared_ptr<const LoweredHaloAxis>& lowered, double fill)
    : gather(HaloGatherStep{lowered->axis.mesh_dim, lowered->axis.tensor_dim}, lowered, fill),
      scatter_add(HaloScatterAddStep{lowered->axis.mesh_dim, lowered->axis.tensor_dim}, lowered) {}

LoweredHalo::LoweredHalo(const HaloPlan& plan, double fill) : mesh(plan.mesh) {
  for (const HaloAxis& axis : plan.axes) axes.emplace_back(axis, mesh, fill);
  if (!mesh.includes_this_rank()) return;  // it runs no kernel (dispatch/kernel.cpp)
  // The steps that move bytes, as the lowering found them, are the ones the plan declares (and
  // explain prints), in the same order.
  std::vector<MoveStep> gathers, scatter_adds;
  for (const HaloAxisSteps& a : axes)
    if (a.lowered().exchanges) gathers.push_back(a.gather.step());
  for (auto a = axes.rbegin(); a != axes.rend(); ++a)
    if (a->lowered().exchanges) scatter_adds.push_back(a->scatter_add.step());
  TORCH_INTERNAL_ASSERT(described(gathers) == described(halo_gathers(plan)) && described(scatter_adds) == described(halo_scatter_adds(plan)),
                        "a halo lowered to the moves [", described(gathers), "], but its plan declares [", described(halo_gathers(plan)), "]");
}

at::Tensor gather_window(const at::Tensor& owned_piece, const HaloAxisSteps& axis, const DeviceMesh& mesh) {
  return run_kernel_step(axis.gather, mesh, owned_piece);
}

at::Tensor scatter_add_window(const at::Tensor& window_piece, const HaloAxisSteps& axis, const DeviceMesh& mesh) {
  return run_kernel_step(axis.scatter_add, mesh, window_piece);
}

at::Tensor gather_windows(const LoweredHalo& halo, at::Tensor owned) {
  for (const HaloAxisSteps& axis : halo.axes) owned = gather_window(owned, axis, halo.mesh);
  return owned;
}

at::Tensor scatter_add_windows(const LoweredHalo& halo, at::Tensor window) {
  for (auto it = halo.axes.rbegin(); it != halo.axes.rend(); ++it) window = scatter_add_window(window, *it, halo.mesh);
  return window;
}

}  // namespace shardtensor
