// The executor: walks a plan's steps over the mesh's communicators. See plan.h for what each
// step means and boxes.h for who sends what: AllGather, AllToAll and Exchange are all box
// exchanges, over one mesh dim's group or over the whole mesh.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "redistribute/executor.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/prod.h>
#include <ATen/ops/sum.h>

#include <numeric>

#include "comm/comm.h"
#include "redistribute/boxes.h"

namespace shardtensor {
namespace {

// The part of `local` (which holds `held`) that covers `part`, as a view.
at::Tensor view_of(const at::Tensor& local, const Box& held, const Box& part) {
  at::Tensor v = local;
  for (int64_t d = 0; d < local.dim(); ++d) v = v.narrow(d, part.offsets[d] - held.offsets[d], part.shape[d]);
  return v;
}

// Whether `parts` (in order, empty ones skipped) are consecutive row blocks that together are
// all of `whole`: then a contiguous tensor holding `whole`, flattened, IS their concatenation,
// and the collective can read from it or write into it without a packing copy.
bool tiles_in_order(const Box& whole, const std::vector<Box>& parts) {
  int64_t next_row = whole.shape.empty() ? 0 : whole.offsets[0];
  int64_t covered = 0;
  for (const Box& part : parts) {
    if (part.empty()) continue;
    if (whole.shape.empty()) return false;
    if (part.offsets[0] != next_row) return false;
    for (size_t d = 1; d < whole.shape.size(); ++d)
      if (part.offsets[d] != whole.offsets[d] || part.shape[d] != whole.shape[d]) return false;
    next_row += part.shape[0];
    covered += part.numel();
  }
  return covered == whole.numel();
}

at::Tensor concatenated(const at::Tensor& local, const Box& held, const std::vector<Box>& parts) {
  std::vector<at::Tensor> pieces;
  for (const Box& part : parts)
    if (!part.empty()) pieces.push_back(view_of(local, held, part).reshape({-1}));
  if (pieces.empty()) return at::empty({0}, local.options());
  return pieces.size() == 1 ? pieces.front().contiguous() : at::cat(pieces);
}

at::Tensor fresh_copy(const at::Tensor& t) { return t.clone(at::MemoryFormat::Contiguous); }

at::Tensor all_reduce(const at::Tensor& local, const DeviceMesh& mesh, const AllReduceStep& step) {
  at::Tensor out = fresh_copy(local);
  // Every member of the group holds the same (Partial) box, so they all skip empty ones together.
  if (out.numel() > 0) mesh.comm(step.mesh_dim).all_reduce(out, step.op);
  return out;
}

at::Tensor reduce_pieces(const at::Tensor& stacked, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return at::sum(stacked, {0});
    case ReduceOp::Avg: return at::sum(stacked, {0}).div_(stacked.size(0));
    case ReduceOp::Max: return at::amax(stacked, {0});
    case ReduceOp::Min: return at::amin(stacked, {0});
    case ReduceOp::Product: return at::prod(stacked, 0);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown ReduceOp");
}

// Gloo has no reduce-scatter: each member sends every other member the piece that member will
// own, which is the bytes a ring reduce-scatter moves, then reduces the n pieces it got.
at::Tensor reduce_scatter(const at::Tensor& local, const ShardTensorSpec& current, const ShardTensorSpec& next,
                          const ReduceScatterStep& step) {
  const DeviceMesh& mesh = current.mesh();
  const Box held = box_of(current, mesh.coordinate());
  const Box mine = box_of(next, mesh.coordinate());
  if (held.empty()) return at::empty(mine.shape, local.options());
  Comm& comm = mesh.comm(step.mesh_dim);
  std::vector<Box> pieces;
  std::vector<int64_t> send_splits, recv_splits;
  std::vector<int64_t> member = mesh.coordinate();
  for (int64_t i = 0; i < comm.size(); ++i) {
    member[step.mesh_dim] = i;
    pieces.push_back(box_of(next, member));
    send_splits.push_back(pieces.back().numel());
    recv_splits.push_back(mine.numel());
  }
  at::Tensor send = local.is_contiguous() && tiles_in_order(held, pieces) ? local.view({-1}) : concatenated(local, held, pieces);
  at::Tensor received = at::empty({comm.size() * mine.numel()}, local.options());
  comm.all_to_all(received, send, recv_splits, send_splits);
  std::vector<int64_t> stacked_shape = mine.shape;
  stacked_shape.insert(stacked_shape.begin(), comm.size());
  return reduce_pieces(received.view(stacked_shape), step.op).contiguous();
}

// Every rank already holds its target box. (An empty target box may lie outside the held one,
// as for a [0, 7] tensor going from S(1) to S(0): nothing to copy then.)
at::Tensor local_slice(const at::Tensor& local, const ShardTensorSpec& current, const ShardTensorSpec& next) {
  const auto& coord = current.mesh().coordinate();
  const Box wanted = box_of(next, coord);
  if (wanted.empty()) return at::empty(wanted.shape, local.options());
  return fresh_copy(view_of(local, box_of(current, coord), wanted));
}

// The ranks a step's data travels between: one mesh dim's group, or the whole mesh.
struct Group {
  Comm& comm;
  std::vector<std::vector<int64_t>> members;  // coordinates, in the communicator's rank order
};

Group group_along(const DeviceMesh& mesh, int64_t mesh_dim) {
  Group group{mesh.comm(mesh_dim), {}};
  std::vector<int64_t> member = mesh.coordinate();
  for (int64_t i = 0; i < mesh.size(mesh_dim); ++i) {
    member[mesh_dim] = i;
    group.members.push_back(member);
  }
  return group;
}

Group whole_mesh(const DeviceMesh& mesh) {
  Group group{mesh.mesh_comm(), {}};
  for (int64_t rank : mesh.ranks()) group.members.push_back(mesh.coordinate_of(rank));
  return group;
}

// One all-to-all over `group`; see boxes.h. When the parts this rank sends or receives are
// consecutive row blocks, the local tensor is the send buffer or the output is the receive
// buffer, and this rank's own part travels through the collective (Gloo copies it locally);
// otherwise its own part is copied directly and never enters the collective.
at::Tensor exchange(const at::Tensor& local, const ShardTensorSpec& current, const ShardTensorSpec& next, const Group& group) {
  const std::vector<int64_t>& me = current.mesh().coordinate();
  const Box held = box_of(current, me);
  const Box wanted = box_of(next, me);
  at::Tensor out = at::empty(wanted.shape, local.options());

  std::vector<Box> outgoing, incoming;
  size_t self_position = 0;
  for (const std::vector<int64_t>& peer : group.members) {
    if (peer == me) self_position = outgoing.size();
    outgoing.push_back(feeds(current, me, peer) ? intersect(held, box_of(next, peer)) : Box::none());
    incoming.push_back(feeds(current, peer, me) ? intersect(box_of(current, peer), wanted) : Box::none());
  }
  const bool send_in_place = local.is_contiguous() && tiles_in_order(held, outgoing);
  const bool receive_in_place = tiles_in_order(wanted, incoming);
  if (!send_in_place && !receive_in_place) {
    const Box& own = incoming[self_position];
    if (!own.empty()) view_of(out, wanted, own).copy_(view_of(local, held, own));
    outgoing[self_position] = incoming[self_position] = Box::none();
  }
  std::vector<int64_t> send_splits, recv_splits;
  for (size_t p = 0; p < outgoing.size(); ++p) {
    send_splits.push_back(outgoing[p].numel());
    recv_splits.push_back(incoming[p].numel());
  }
  at::Tensor send = send_in_place ? local.view({-1}) : concatenated(local, held, outgoing);
  at::Tensor received = receive_in_place ? out.view({-1}) : at::empty({std::accumulate(recv_splits.begin(), recv_splits.end(), int64_t{0})}, local.options());
  group.comm.all_to_all(received, send, recv_splits, send_splits);
  if (receive_in_place) return out;
  int64_t offset = 0;
  for (const Box& part : incoming) {
    if (part.empty()) continue;
    view_of(out, wanted, part).copy_(received.narrow(0, offset, part.numel()).view(part.shape));
    offset += part.numel();
  }
  return out;
}

}  // namespace

at::Tensor execute_redistribute(const at::Tensor& local, const ShardTensorSpec& source, const RedistributePlan& plan) {
  if (plan.empty()) return fresh_copy(local);
  at::Tensor current_local = local;
  const ShardTensorSpec* current = &source;
  for (const PlannedStep& planned : plan.steps) {
    const RedistributeStep& step = planned.step;
    if (auto* s = std::get_if<AllReduceStep>(&step)) {
      current_local = all_reduce(current_local, source.mesh(), *s);
    } else if (auto* s = std::get_if<ReduceScatterStep>(&step)) {
      current_local = reduce_scatter(current_local, *current, planned.after, *s);
    } else if (auto* s = std::get_if<AllGatherStep>(&step)) {
      current_local = exchange(current_local, *current, planned.after, group_along(source.mesh(), s->mesh_dim));
    } else if (auto* s = std::get_if<AllToAllStep>(&step)) {
      current_local = exchange(current_local, *current, planned.after, group_along(source.mesh(), s->mesh_dim));
    } else if (std::holds_alternative<LocalChunkStep>(step)) {
      current_local = local_slice(current_local, *current, planned.after);
    } else {
      current_local = exchange(current_local, *current, planned.after, whole_mesh(source.mesh()));
    }
    current = &planned.after;
  }
  return current_local;
}

}  // namespace shardtensor
