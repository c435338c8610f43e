// A kernel's mid-op reductions, as its plan declared them.
//
// Norms, the losses' global means, global comparisons and the random draws' checks reduce a
// small tensor over the groups of some mesh dims in the middle of their op. The plan declares
// each of those all-reduces (rules/kernel_plan.h: DeclaredMove), and explain prints them; the
// kernel runs exactly those, through this, lowered with the plan: it cannot reduce over a group
// its plan did not declare, and what it runs is what explain printed
// (tests/dist/explained_moves_test.cpp counts both). Kernels reach the executor through nothing
// else (tests/unit/include_graph_test.cpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "rules/kernel_plan.h"
#include "shardtensor/device_mesh.h"

namespace at {
class Tensor;
}

namespace shardtensor {

class DeclaredReductions {
 public:
  // The AllReduce moves of `declared` (a plan's moves()), on `mesh`.
  DeclaredReductions(DeviceMesh mesh, const std::vector<DeclaredMove>& declared);

  // Reduces `tensor` in place over each declared group in turn, with each move's op, by the
  // transport the options in force choose (redistribute/transport.h: reduction_transport).
  // Every member of each group must call it, with a tensor of the same shape.
  void run(const at::Tensor& tensor) const;
  // Whether the plan declared none (a layout whose reduced dims are not split).
  bool empty() const { return steps_.empty(); }

 private:
  DeviceMesh mesh_;
  std::vector<std::pair<int64_t, ReduceOp>> steps_;  // (mesh dim, op), in the declared order
};

}  // namespace shardtensor
