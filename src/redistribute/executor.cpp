// The executor: walks a plan's steps over the mesh's communicators. See plan.h for what each
// step means and boxes.h for who sends what: AllGather, AllToAll and Exchange are all box
// exchanges, over one mesh dim's group or over the whole mesh. Each step is described as a
// PartExchange and moved by the transport the plan chose (transports/part_transport.h); only
// the equal-piece collectives (transports/collective_transport.h) bypass the description.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "redistribute/executor.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>
#include <utility>

#include "comm/comm.h"
#include "comm/fingerprint.h"
#include "redistribute/boxes.h"
#include "redistribute/transport.h"
#include "redistribute/transports/collective_transport.h"
#include "redistribute/transports/part_transport.h"
#include "redistribute/transports/traced_bytes.h"
#include "spec/sequence_order.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

at::Tensor fresh_copy(const at::Tensor& t) { return t.clone(at::MemoryFormat::Contiguous); }

// `box` with a leading dim: [offset, offset + extent) in front of its own.
Box with_leading(const Box& box, int64_t offset, int64_t extent) {
  Box out = box;
  out.offsets.insert(out.offsets.begin(), offset);
  out.shape.insert(out.shape.begin(), extent);
  return out;
}

// The reduce-scatter of uneven pieces (and Gloo's, which lacks one), with the bytes a ring
// moves. `local` holds `held` (the same box on every member: the data is Partial along this
// group); member p ends with the reduction of `targets[p]` over the group. Each member gets the
// other members' copies of its target into a stack of n-1 slots and reduces them with its own,
// read in place, into `out`; where the transport reads the holders' memory in place, the copies
// are combined straight from there (transports/reduction.h).
void reduce_scatter_boxes(Comm& comm, const at::Tensor& local, const Box& held, const std::vector<Box>& targets, const at::Tensor& out,
                          ReduceOp op, const char* counted_as, const StepTransport& how) {
  const int64_t n = static_cast<int64_t>(targets.size()), self = comm.rank();
  std::vector<int64_t> incoming_shape = out.sizes().vec();
  incoming_shape.insert(incoming_shape.begin(), n - 1);
  PartExchange exchange{{}, local, at::empty(incoming_shape, out.options()), counted_as};
  exchange.reduction = PartReduction{op, view_of_part(local, held, targets[self]), out, n};
  // Holder h's copy lands in receiver r's slot h (h < r) or h - 1: a leading slot dim makes
  // that a box like any other.
  auto part = [&](int64_t h, int64_t r) {
    const int64_t slot = h < r ? h : h - 1;
    return PeerPart{h, r, with_leading(targets[r], slot, 1), with_leading(held, slot, 1), with_leading(targets[r], 0, n - 1)};
  };
  for (int64_t p = 0; p < n; ++p) {
    if (p == self) continue;
    exchange.parts.push_back(part(p, self));
    exchange.parts.push_back(part(self, p));
  }
  move_parts(comm, how, exchange);
}

// A plan's AllReduce step: all_reduce_on (executor.h) over the step's group.
at::Tensor all_reduce(const at::Tensor& local, const DeviceMesh& mesh, const AllReduceStep& step, StepTransport how) {
  if (how.kind == TransportKind::None) return fresh_copy(local);
  return all_reduce_on(mesh.comm(step.mesh_dim), local, step.op, how);
}

// The size of `spec`'s tensor over its ranks: the same on every rank, so whether a transfer
// goes through peer memory can be decided on it.
int64_t bytes_per_rank(const ShardTensorSpec& spec) {
  const int64_t numel = std::accumulate(spec.shape().begin(), spec.shape().end(), int64_t{1}, std::multiplies<>());
  return numel * static_cast<int64_t>(c10::elementSize(spec.dtype())) / spec.mesh().size();
}

// What the transports' fingerprints call a step of a plan and a scatter (see TransferScope).
struct Step {
  const ShardTensorSpec& from;
  const ShardTensorSpec& to;
};
// The shard sizes go last: ranks that agree on placements but not on sizes (explicit sizes
// that differ between ranks) must get different fingerprints too.
std::string describe_step(const void* context) {
  const Step& s = *static_cast<const Step*>(context);
  std::string out = to_string(s.from.placements()) + " -> " + to_string(s.to.placements()) + " of " + c10::toString(s.from.dtype()) +
                    "[" + join(s.from.shape(), ", ") + "] on " + s.from.mesh().to_string();
  for (const ShardTensorSpec* side : {&s.from, &s.to}) {
    out += side == &s.from ? ", sizes" : " ->";
    for (const DimShardSizes& d : side->shard_sizes()) out += " dim " + std::to_string(d.tensor_dim) + " [" + join(d.sizes, ", ") + "]";
  }
  return out;
}

struct Scatter {
  const std::vector<int64_t>& root;
  const ShardTensorSpec& target;
};
std::string describe_scatter(const void* context) {
  const Scatter& s = *static_cast<const Scatter*>(context);
  return "scatter from mesh coordinate [" + join(s.root, ", ") + "] to " + s.target.to_string() + " of " + c10::toString(s.target.dtype());
}

}  // namespace

// Out of place, as a reduce-scatter of flat chunks followed by an all-gather of the reduced
// chunks, both copied through the peers' memory or sent as messages: the bytes of a ring
// all-reduce, with no copy of the input first.
at::Tensor all_reduce_on(Comm& comm, const at::Tensor& local, ReduceOp op, StepTransport how) {
  const int64_t n = comm.size(), me = comm.rank();
  how = available_on(comm, how);
  // Peer memory turned out unavailable: small reductions go to c10d, as transport_for sends them
  // when peer memory is off.
  if (how.kind == TransportKind::Messages && static_cast<int64_t>(local.nbytes()) < kMessagesAllReduceBytes)
    how.kind = TransportKind::Collective;
  if (how.kind == TransportKind::Collective) {
    at::Tensor out = fresh_copy(local);
    comm.all_reduce(out, op);
    return out;
  }
  // Traced, the two exchanges below would be two operators of the graph, with the copies between
  // them functionalized into passes over the whole tensor: one operator runs them as here.
  if (comm.records_graph()) return traced_all_reduce(comm, local, op, how);
  at::Tensor out = at::empty(local.sizes(), local.options());
  const at::Tensor flat = local.contiguous().view({-1});
  const at::Tensor out_flat = out.view({-1});
  const Box whole{{0}, {flat.numel()}};
  std::vector<Box> chunks;
  for (int64_t size : chunk_sizes(flat.numel(), n))
    chunks.push_back(Box{{chunks.empty() ? 0 : chunks.back().offsets[0] + chunks.back().shape[0]}, {size}});
  reduce_scatter_boxes(comm, flat, whole, chunks, view_of_part(out_flat, whole, chunks[me]), op, "all_reduce", how);

  // The reduced chunks to every member; peer memory may have gone back to messages meanwhile.
  PartExchange gather{{}, out_flat, out_flat, "all_reduce", /*counts=*/false};
  for (int64_t p = 0; p < n; ++p) {
    if (p == me) continue;
    gather.parts.push_back({p, me, chunks[p], whole, whole});
    gather.parts.push_back({me, p, chunks[me], whole, whole});
  }
  move_parts(comm, how, gather);
  return out;
}

at::Tensor local_box_of(const at::Tensor& global, const ShardTensorSpec& spec) {
  const Box whole{std::vector<int64_t>(spec.ndim(), 0), spec.shape()};
  if (has_zigzag(spec)) {  // the piece is stretches of the whole, copied into place: a copy, not a view
    const at::Tensor piece = at::empty(spec.local_shape(), global.options());
    for (const Stretch& s : stretches_of(spec, spec.mesh().coordinate())) {
      at::Tensor into = piece;
      for (int64_t d = 0; d < piece.dim(); ++d) into = into.narrow(d, s.local_start[d], s.global.shape[d]);
      into.copy_(view_of_part(global, whole, s.global));
    }
    return piece;
  }
  return view_of_part(global, whole, box_of(spec, spec.mesh().coordinate()));
}

at::Tensor piece_outside_mesh(const ShardTensorSpec& spec, const c10::TensorOptions& options) {
  return at::zeros(spec.local_shape(), options);
}

at::Tensor scatter_boxes(const at::Tensor& source, const std::vector<int64_t>& root, const ShardTensorSpec& target) {
  const DeviceMesh& mesh = target.mesh();
  const Scatter named{root, target};
  const TransferScope transfer(describe_scatter, &named);
  const std::vector<std::vector<int64_t>> members = members_along(mesh, -1);
  const auto position_of = [&](const std::vector<int64_t>& c) { return std::find(members.begin(), members.end(), c) - members.begin(); };
  const int64_t n = static_cast<int64_t>(members.size());
  const int64_t from = position_of(root), self = position_of(mesh.coordinate());
  const Box whole{std::vector<int64_t>(target.ndim(), 0), target.shape()};
  const Box mine = box_of(target, mesh.coordinate());
  at::Tensor local = at::empty(mine.shape, source.options().dtype(target.dtype()));
  if (self == from && !mine.empty()) local.copy_(view_of_part(source, whole, mine));
  if (n == 1) return local;
  // The root's parts to everyone, or this rank's from the root.
  PartExchange parts{{}, self == from ? source : local, local, "scatter"};
  for (int64_t p = 0; p < n; ++p)
    if (p != from && (self == from || p == self)) {
      const Box box = box_of(target, members[p]);
      parts.parts.push_back({from, p, box, whole, box});
    }
  const ResolvedTransportOptions options = resolve();
  const bool through_memory = source.is_cpu() && uses_peer_memory(mesh, bytes_per_rank(target), options);
  move_parts(mesh.mesh_comm(), {through_memory ? same_host_kind(options) : TransportKind::Messages, "scatter", "scatter", options.message_bytes},
             parts);
  return local;
}

void reduce_in_place(const LoweredStep& reduction, const DeviceMesh& mesh, const at::Tensor& tensor) {
  if (tensor.numel() == 0) return;
  const auto& step = std::get<AllReduceStep>(reduction.step());
  const StepTransport how = reduction_transport(mesh, step.mesh_dim, static_cast<int64_t>(tensor.nbytes()));
  if (how.kind == TransportKind::None) return;
  if (how.kind == TransportKind::Collective)
    mesh.comm(step.mesh_dim).all_reduce(tensor, step.op);  // in place: no copy in or out
  else
    tensor.copy_(reduction.apply(tensor, mesh, how));
}

at::Tensor run_kernel_step(const LoweredStep& step, const DeviceMesh& mesh, const at::Tensor& piece) {
  if (std::holds_alternative<StatisticsGatherStep>(step.step())) return step.apply(piece, mesh, StepTransport{});
  TORCH_INTERNAL_ASSERT(is_halo_step(step.step()), to_string(step.step()), " is not a kernel's halo or gather step");
  const StepTransport how = step.halo().exchanges
                                ? exchange_transport(mesh, step.bytes_per_member(piece), piece.is_cpu(), "all_to_all")
                                : StepTransport{};
  return step.apply(piece, mesh, how);
}

std::vector<std::vector<at::Tensor>> run_ring_batch(const LoweredStep& step, int64_t batch, const std::vector<std::vector<at::Tensor>>& sent,
                                                    const std::vector<at::Tensor>& like, const DeviceMesh& mesh,
                                                    const std::function<void()>& while_moving) {
  StepTransport how = exchange_transport(mesh, step.widest_block_bytes(like), like.at(0).is_cpu(), counted_as(step.step()));
  if (how.kind == TransportKind::Collective) how.kind = TransportKind::Messages;
  return step.apply(batch, sent, like, mesh, how, while_moving);
}

void all_reduce_over(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims, const at::Tensor& tensor, ReduceOp op) {
  for (int64_t m : mesh_dims) reduce_in_place(LoweredStep(AllReduceStep{m, op}), mesh, tensor);
}

namespace {

// A redistribute already recorded in the graph being traced (traced_bytes.h): the same bytes from
// the same layout to the same one again take a copy of its result, so that a derivative reads
// what its forward moved (which AOTAutograd then saves) instead of moving it again in backward.
// Per thread, 256 of them: a forward's moves stay findable through a block's backward.
thread_local RecordedMoves<std::pair<ShardTensorSpec, ShardTensorSpec>> recorded_redistributes(256);

at::Tensor execute_plan(const at::Tensor& local, const ShardTensorSpec& source, const RedistributePlan& plan,
                        const ResolvedTransportOptions& options);

}  // namespace

at::Tensor execute_redistribute(const at::Tensor& local, const ShardTensorSpec& source, const RedistributePlan& plan,
                                const ResolvedTransportOptions& options) {
  if (plan.empty() || !is_traced_piece(local)) return execute_plan(local, source, plan, options);
  std::pair<ShardTensorSpec, ShardTensorSpec> layouts{source, plan.steps.back().after};
  const std::vector<TracedBytes> read{TracedBytes(local)};
  if (const at::Tensor earlier = recorded_redistributes.find(layouts, read); earlier.defined()) return fresh_copy(earlier);
  at::Tensor result = execute_plan(local, source, plan, options);
  recorded_redistributes.add(std::move(layouts), read, result);
  return result;
}

namespace {

at::Tensor execute_plan(const at::Tensor& local, const ShardTensorSpec& source, const RedistributePlan& plan,
                        const ResolvedTransportOptions& options) {
  if (plan.empty()) return fresh_copy(local);
  // Outside the mesh a piece is empty in every layout: nothing to move, nobody to move it with.
  if (!source.mesh().includes_this_rank()) return piece_outside_mesh(plan.steps.back().after, local.options());
  // Every rank of a mesh holds meta pieces alike (distribute_tensor checks it), so all raise.
  TORCH_CHECK(!local.is_meta(), "cannot move the values of ", source, ": its pieces are on the meta device and hold none. ",
              "Materialise it first (Module.to_empty(device=...), or empty_like(x, device=...)), then initialise it.");
  at::Tensor current_local = local;
  const ShardTensorSpec* current = &source;
  for (const PlannedStep& planned : plan.steps) {
    const MoveStep& step = planned.step();
    // Names the step in the transports' fingerprints, so that ranks running different steps or
    // different redistributes get an error that names both.
    const Step named{*current, planned.after};
    const TransferScope transfer(describe_step, &named);
    const StepTransport how = plan.lowered_with == options ? planned.transport : transport_for(step, *current, planned.after, options);
    current_local = planned.lowered.apply(current_local, source.mesh(), how);
    current = &planned.after;
  }
  return current_local;
}

}  // namespace

at::Tensor LoweredStep::apply(const at::Tensor& piece, const DeviceMesh& mesh, const StepTransport& how) const {
  if (auto* s = std::get_if<AllReduceStep>(&step_)) {
    if (norm_) return all_reduce(piece.pow(*norm_), mesh, AllReduceStep{s->mesh_dim, ReduceOp::Sum}, how).pow_(1.0 / *norm_);
    return all_reduce(piece, mesh, *s, how);
  }
  if (auto* s = std::get_if<ReduceScatterStep>(&step_)) {
    if (norm_) return reduce_scatter(piece.pow(*norm_), mesh, ReduceOp::Sum, how).pow_(1.0 / *norm_);
    return reduce_scatter(piece, mesh, s->op, how);
  }
  if (auto* s = std::get_if<AllGatherStep>(&step_)) {
    if (how.kind == TransportKind::Collective && how.collective == std::string("all_gather"))
      return gather_equal_pieces(mesh.comm(s->mesh_dim), piece, s->tensor_dim);
    return exchange(piece, mesh, how);
  }
  if (std::holds_alternative<LocalChunkStep>(step_)) return local_slice(piece);
  if (std::holds_alternative<HaloGatherStep>(step_)) return gather_window(piece, mesh, how);
  if (std::holds_alternative<HaloScatterAddStep>(step_)) return scatter_add_window(piece, mesh, how);
  if (std::holds_alternative<StatisticsGatherStep>(step_)) return gather_statistics(piece, mesh);
  TORCH_INTERNAL_ASSERT(std::holds_alternative<AllToAllStep>(step_) || std::holds_alternative<ExchangeStep>(step_), to_string(step_),
                        " is not a step that this apply() runs (a ring step's batches take the ring's apply)");
  return exchange(piece, mesh, how);
}

// Every member's `mine` (one shape on all of them), stacked along a new dim 0 in group rank
// order, by c10d's all_gather (per-row statistics are small; the merge needs all of them at once).
at::Tensor LoweredStep::gather_statistics(const at::Tensor& mine, const DeviceMesh& mesh) const {
  const int64_t mesh_dim = std::get<StatisticsGatherStep>(step_).mesh_dim;
  std::vector<int64_t> shape = mine.sizes().vec();
  shape.insert(shape.begin(), mesh.size(mesh_dim));
  const at::Tensor all = at::empty(shape, mine.options());
  mesh.comm(mesh_dim).all_gather(mine.contiguous(), all);
  return all;
}

at::Tensor LoweredStep::reduce_scatter(const at::Tensor& piece, const DeviceMesh& mesh, ReduceOp op, const StepTransport& how) const {
  if (held_.empty()) return at::empty(wanted_.shape, piece.options());
  const auto& step = std::get<ReduceScatterStep>(step_);
  Comm& comm = mesh.comm(step.mesh_dim);
  if (how.kind == TransportKind::Collective && how.collective == std::string("reduce_scatter"))
    return reduce_scatter_equal_pieces(comm, piece, step.tensor_dim, op);
  at::Tensor out = at::empty(wanted_.shape, piece.options());
  reduce_scatter_boxes(comm, piece, held_, targets_, out, op, how.counted_as, how);
  return out;
}

// Every rank already holds its target box. (An empty target box may lie outside the held one,
// as for a [0, 7] tensor going from S(1) to S(0): nothing to copy then.)
at::Tensor LoweredStep::local_slice(const at::Tensor& piece) const {
  if (wanted_.empty()) return at::empty(wanted_.shape, piece.options());
  return fresh_copy(view_of_part(piece, held_, wanted_));
}

// One all-to-all over the step's group (boxes.h): every part goes from its holder's piece to its
// receiver's result, by the step's transport; this rank's own part is copied locally while the
// others travel, and never travels.
at::Tensor LoweredStep::exchange(const at::Tensor& piece, const DeviceMesh& mesh, const StepTransport& how) const {
  const int64_t mesh_dim = mesh_dim_of(step_);
  at::Tensor out = at::empty(wanted_.shape, piece.options());
  PartExchange parts{parts_, piece, out, how.counted_as};
  parts.local_work = [&] {
    if (!own_.empty()) view_of_part(out, wanted_, own_).copy_(view_of_part(piece, held_, own_));
    for (const PeerPart& p : kept_) view_of_part(out, p.receiver_holds, p.part).copy_(view_of_part(piece, p.holder_holds, p.part));
  };
  // A step that moves nothing between ranks on any of them (transport_for: only cuts) is local
  // work alone; a graph still holds it as an exchange (part_transport.h says why).
  Comm& comm = mesh_dim < 0 ? mesh.mesh_comm() : mesh.comm(mesh_dim);
  if (how.kind == TransportKind::None && !comm.records_graph()) {
    parts.local_work();
    return out;
  }
  move_parts(comm, how, parts);
  return out;
}

}  // namespace shardtensor
