// The executor: walks a plan's steps over the mesh's communicators. See plan.h for what each
// step means and boxes.h for who sends what: AllGather, AllToAll and Exchange are all box
// exchanges, over one mesh dim's group or over the whole mesh.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "redistribute/executor.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/mul.h>

#include <algorithm>
#include <atomic>

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

// A part travels as messages of about this many bytes, cut along its first dim, so that
// packing one overlaps sending the one before. Sender and receiver see the same part shape,
// so they cut it the same way.
std::atomic<int64_t> message_bytes{4 << 20};  // smaller messages measured slower on loopback Gloo

std::vector<at::Tensor> message_pieces(const at::Tensor& part) {
  if (part.dim() == 0 || part.size(0) <= 1) return {part};
  const int64_t row_bytes = std::max<int64_t>(1, part.numel() / part.size(0) * static_cast<int64_t>(part.element_size()));
  const int64_t rows = std::max<int64_t>(1, message_bytes.load(std::memory_order_relaxed) / row_bytes);
  std::vector<at::Tensor> pieces;
  for (int64_t begin = 0; begin < part.size(0); begin += rows) pieces.push_back(part.narrow(0, begin, std::min(rows, part.size(0) - begin)));
  return pieces;
}

// Posts receives into `destination` (a view of the result): straight into it where a piece
// is contiguous, else into a staging buffer that `to_unpack` copies in after the wait.
void receive_into(Messages& messages, int64_t peer, const at::Tensor& destination,
                  std::vector<std::pair<at::Tensor, at::Tensor>>& to_unpack) {
  for (const at::Tensor& piece : message_pieces(destination)) {
    if (piece.is_contiguous()) {
      messages.receive(peer, piece);
    } else {
      at::Tensor staging = at::empty(piece.sizes(), piece.options());
      messages.receive(peer, staging);
      to_unpack.emplace_back(staging, piece);
    }
  }
}

void send_from(Messages& messages, int64_t peer, const at::Tensor& source) {
  for (const at::Tensor& piece : message_pieces(source)) messages.send(peer, piece.contiguous());  // no copy for row blocks
}

// The other members of a group of n, starting after `self`: every rank sends in this order, so
// that they do not all send to the same peer first.
template <class Visit>
void for_each_peer_after(int64_t self, int64_t n, Visit&& visit) {
  for (int64_t k = 1; k < n; ++k) visit((self + k) % n);
}

at::Tensor fresh_copy(const at::Tensor& t) { return t.clone(at::MemoryFormat::Contiguous); }

// out = a op b, elementwise; `out` may be `a`.
void combine(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: at::add_out(const_cast<at::Tensor&>(out), a, b); return;
    case ReduceOp::Max: at::maximum_out(const_cast<at::Tensor&>(out), a, b); return;
    case ReduceOp::Min: at::minimum_out(const_cast<at::Tensor&>(out), a, b); return;
    case ReduceOp::Product: at::mul_out(const_cast<at::Tensor&>(out), a, b); return;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown ReduceOp");
}

// Writes the reduction of `own` and the n-1 pieces stacked in `incoming` into `out`: the first
// combination reads `own` in place, so nothing is copied first.
void reduce_pieces_into(const at::Tensor& out, const at::Tensor& own, const at::Tensor& incoming, ReduceOp op, int64_t n) {
  if (incoming.size(0) == 0) out.copy_(own);
  for (int64_t i = 0; i < incoming.size(0); ++i) combine(out, i == 0 ? own : out, incoming[i], op);
  if (op == ReduceOp::Avg) out.div_(n);
}

// Each member of a group of n sends every other member the piece that member will own
// (`pieces`, by group position), then reduces the n-1 pieces it received with its own into
// `out`: the bytes a ring reduce-scatter moves. Gloo has no reduce-scatter.
void reduce_scatter_pieces(Comm& comm, int64_t self, const std::vector<at::Tensor>& pieces, const at::Tensor& out,
                           ReduceOp op, const char* counted_as) {
  const int64_t n = static_cast<int64_t>(pieces.size());
  std::vector<int64_t> incoming_shape = out.sizes().vec();
  incoming_shape.insert(incoming_shape.begin(), n - 1);
  at::Tensor incoming = at::empty(incoming_shape, out.options());
  std::vector<std::pair<at::Tensor, at::Tensor>> to_unpack;  // stays empty: the slots are contiguous
  auto messages = comm.start_messages(counted_as);
  for (int64_t p = 0, slot = 0; p < n; ++p)
    if (p != self) receive_into(*messages, p, incoming[slot++], to_unpack);
  for_each_peer_after(self, n, [&](int64_t p) { send_from(*messages, p, pieces[p]); });
  messages->wait();
  reduce_pieces_into(out, pieces[self], incoming, op, n);
}

constexpr int64_t kMessagesAllReduceBytes = 2 << 20;

// Large tensors go out of place, as a reduce-scatter of flat chunks followed by an all-gather
// of the reduced chunks, both as point-to-point messages: the bytes of a ring all-reduce, with
// no copy of the input first. For small tensors two rounds of messages cost more
// latency than the copy that c10d's in-place all-reduce needs, so small ones (under 2 MiB) go
// there.
at::Tensor all_reduce(const at::Tensor& local, const DeviceMesh& mesh, const AllReduceStep& step) {
  Comm& comm = mesh.comm(step.mesh_dim);
  const int64_t n = comm.size(), me = comm.rank();
  // Every member of the group holds the same (Partial) box, so they all skip empty ones together.
  if (n == 1 || local.numel() == 0) return fresh_copy(local);
  if (static_cast<int64_t>(local.nbytes()) < kMessagesAllReduceBytes) {
    at::Tensor out = fresh_copy(local);
    comm.all_reduce(out, step.op);
    return out;
  }
  at::Tensor out = at::empty(local.sizes(), local.options());
  const at::Tensor flat = local.contiguous().view({-1});
  const at::Tensor out_flat = out.view({-1});
  const std::vector<int64_t> sizes = chunk_sizes(flat.numel(), n);
  std::vector<int64_t> offsets(n, 0);
  for (int64_t p = 1; p < n; ++p) offsets[p] = offsets[p - 1] + sizes[p - 1];
  auto chunk = [&](const at::Tensor& t, int64_t p) { return t.narrow(0, offsets[p], sizes[p]); };

  std::vector<at::Tensor> pieces;
  for (int64_t p = 0; p < n; ++p) pieces.push_back(chunk(flat, p));
  reduce_scatter_pieces(comm, me, pieces, chunk(out_flat, me), step.op, "all_reduce");

  std::vector<std::pair<at::Tensor, at::Tensor>> to_unpack;  // stays empty: 1-D pieces are contiguous
  auto gather = comm.start_messages("all_reduce", /*counts=*/false);
  for (int64_t p = 0; p < n; ++p)
    if (p != me) receive_into(*gather, p, chunk(out_flat, p), to_unpack);
  for_each_peer_after(me, n, [&](int64_t p) { send_from(*gather, p, chunk(out_flat, me)); });
  gather->wait();
  return out;
}

// The ranks a step's data travels between: one mesh dim's group, or the whole mesh.
struct Group {
  Comm& comm;
  std::vector<std::vector<int64_t>> members;  // coordinates, in the communicator's rank order

  int64_t position_of(const std::vector<int64_t>& coordinate) const {
    return std::find(members.begin(), members.end(), coordinate) - members.begin();
  }
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

at::Tensor reduce_scatter(const at::Tensor& local, const ShardTensorSpec& current, const ShardTensorSpec& next,
                          const ReduceScatterStep& step) {
  const DeviceMesh& mesh = current.mesh();
  const Box held = box_of(current, mesh.coordinate());
  const Box mine = box_of(next, mesh.coordinate());
  if (held.empty()) return at::empty(mine.shape, local.options());
  const Group group = group_along(mesh, step.mesh_dim);
  std::vector<at::Tensor> pieces;  // views of local: this rank's own one is read in place
  for (const std::vector<int64_t>& member : group.members) pieces.push_back(view_of(local, held, box_of(next, member)));
  at::Tensor out = at::empty(mine.shape, local.options());
  reduce_scatter_pieces(group.comm, group.position_of(mesh.coordinate()), pieces, out, step.op, "all_to_all");
  return out;
}

// Every rank already holds its target box. (An empty target box may lie outside the held one,
// as for a [0, 7] tensor going from S(1) to S(0): nothing to copy then.)
at::Tensor local_slice(const at::Tensor& local, const ShardTensorSpec& current, const ShardTensorSpec& next) {
  const auto& coord = current.mesh().coordinate();
  const Box wanted = box_of(next, coord);
  if (wanted.empty()) return at::empty(wanted.shape, local.options());
  return fresh_copy(view_of(local, box_of(current, coord), wanted));
}

// One all-to-all over `group`; see boxes.h. Parts that are row blocks (contiguous views) are
// sent straight from the local tensor and received straight into the result; only other parts
// go through a staging copy. This rank's own part is copied locally and never travels.
at::Tensor exchange(const at::Tensor& local, const ShardTensorSpec& current, const ShardTensorSpec& next, const Group& group) {
  const std::vector<int64_t>& me = current.mesh().coordinate();
  const Box held = box_of(current, me);
  const Box wanted = box_of(next, me);
  at::Tensor out = at::empty(wanted.shape, local.options());

  // Receives first, so that every send finds its receive posted; this rank's own part is
  // copied while the messages travel.
  auto messages = group.comm.start_messages();
  std::vector<std::pair<at::Tensor, at::Tensor>> to_unpack;
  Box own = Box::none();
  for (size_t p = 0; p < group.members.size(); ++p) {
    const std::vector<int64_t>& peer = group.members[p];
    const Box incoming = feeds(current, peer, me) ? intersect(box_of(current, peer), wanted) : Box::none();
    if (peer == me) own = incoming;
    else if (!incoming.empty()) receive_into(*messages, static_cast<int64_t>(p), view_of(out, wanted, incoming), to_unpack);
  }
  for_each_peer_after(group.position_of(me), static_cast<int64_t>(group.members.size()), [&](int64_t p) {
    const Box outgoing = feeds(current, me, group.members[p]) ? intersect(held, box_of(next, group.members[p])) : Box::none();
    if (!outgoing.empty()) send_from(*messages, p, view_of(local, held, outgoing));
  });
  if (!own.empty()) view_of(out, wanted, own).copy_(view_of(local, held, own));
  messages->wait();
  for (auto& [staging, destination] : to_unpack) destination.copy_(staging);
  return out;
}

}  // namespace

void set_message_bytes(int64_t bytes) {
  TORCH_CHECK(bytes > 0, "set_message_bytes: ", bytes, " is not a positive size");
  message_bytes = bytes;
}

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
