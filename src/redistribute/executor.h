// Runs a RedistributePlan on this rank's local tensor. The only place in redistribution where
// the rank matters (which slice do I send, which do I own).
#pragma once

#include <c10/core/TensorOptions.h>

#include <functional>
#include <vector>

#include "redistribute/plan.h"

namespace at {
class Tensor;
}

namespace shardtensor {

class Comm;

// `local` holds this rank's piece under `source`; returns its piece under the plan's last
// layout, always a fresh tensor (never a view of `local`). Every rank of the mesh must call
// this with the same source spec, plan and options. The steps go by the transports the plan
// was lowered with where `options` are those; by transports chosen afresh where they are not
// (a plan a propagation cached under other options in force).
at::Tensor execute_redistribute(const at::Tensor& local, const ShardTensorSpec& source, const RedistributePlan& plan,
                                const ResolvedTransportOptions& options = resolve());

// In place: `tensor` reduced by `reduction` (a kernel's mid-op AllReduceStep, lowered) over its
// group of `mesh`, by the transport a redistribute's AllReduce step of its bytes takes
// (transport.h): the mid-op reductions of norms, losses and reductions go as a Partial's do,
// through peer memory on local CPU ranks, and through the same LoweredStep::apply. The ranks of
// the group hold the same shape, so an empty tensor is empty across its group and is skipped
// there without communicating.
void reduce_in_place(const LoweredStep& reduction, const DeviceMesh& mesh, const at::Tensor& tensor);
// A kernel's halo gather or scatter-add, or its statistics gather (the attention merge's),
// lowered: this rank's result for its `piece`, through the same LoweredStep::apply, by the
// transport the options in force choose for the step's bytes (transport.h:
// exchange_transport; the statistics go by c10d's all_gather). Every member of the step's
// group calls it with the same step.
at::Tensor run_kernel_step(const LoweredStep& step, const DeviceMesh& mesh, const at::Tensor& piece);
// A ring step's batch `batch` (LoweredStep's ring apply: `sent`, `like` and `while_moving` are
// its), by the transport the options in force choose for the widest block's bytes
// (transport.h: exchange_transport), but point to point where no memory is shared: Gloo
// messages, never an all_to_all that packs and unpacks every block (a ring holds two blocks,
// not four). Every member of the step's group runs every batch, in order, even with nothing
// to move.
std::vector<std::vector<at::Tensor>> run_ring_batch(const LoweredStep& step, int64_t batch, const std::vector<std::vector<at::Tensor>>& sent,
                                                    const std::vector<at::Tensor>& like, const DeviceMesh& mesh,
                                                    const std::function<void()>& while_moving = {});
// `local` reduced by `op` over `comm`'s group, a fresh tensor, through `how` (an AllReduce
// step's transport): c10d's all_reduce, or a reduce-scatter and an all-gather of flat chunks
// through peer memory or messages. While tracing, one operator of the graph (traced_all_reduce).
at::Tensor all_reduce_on(Comm& comm, const at::Tensor& local, ReduceOp op, StepTransport how);
// all_reduce_on recorded as one shardtensor::all_reduce_parts call, whose kernel runs it
// (redistribute/transports/traced_all_reduce.cpp). Only while tracing.
at::Tensor traced_all_reduce(Comm& comm, const at::Tensor& local, ReduceOp op, const StepTransport& how);
// The same over the groups of `mesh_dims` of `mesh`, one reduction per mesh dim, lowered per call.
void all_reduce_over(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims, const at::Tensor& tensor, ReduceOp op);

// This rank's box under `spec` of `global` (a tensor of spec's global shape), as a view: what
// the rank holds of a tensor every rank has whole (a copy where spec has a zigzag dim, whose
// piece is two stretches). No communication.
at::Tensor local_box_of(const at::Tensor& global, const ShardTensorSpec& spec);

// The piece a rank outside `spec`'s mesh holds: empty in every dim (a 0-d tensor's is a 0-d
// zero), with `options`. See DeviceMesh::includes_this_rank.
at::Tensor piece_outside_mesh(const ShardTensorSpec& spec, const c10::TensorOptions& options);

// One scatter over the whole mesh: every rank gets its box under `target` (Partial mesh dims
// split nothing) of the tensor that the rank at mesh coordinate `root` passes as `source`
// (global shape, on the mesh's device; other ranks pass any tensor, unread). Each rank
// receives only its box. Every rank of the mesh must call this with the same spec and root.
at::Tensor scatter_boxes(const at::Tensor& source, const std::vector<int64_t>& root, const ShardTensorSpec& target);

}  // namespace shardtensor
