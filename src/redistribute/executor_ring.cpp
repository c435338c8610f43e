// The ring steps' part of LoweredStep::apply (lowered_step.h): one batch of blocks passed
// between the members of the ring's group (attention's keys and values, their gradients, and
// the gradients' way home), as one exchange of parts through the transport seam
// (transports/part_transport.h), so that whichever transport the options in force choose
// carries it: peer memory or the shared arena on one host, Gloo messages elsewhere.
//
// What a member sends one peer travels as one part: its blocks' tensors one after another, in
// the order the batch lists them on both sides. Tensors that already lie one after another in
// one buffer (what an earlier batch received, say) travel from there; others are packed first.
// What arrives from a peer lands in one buffer, of which the received blocks are views, so a
// block that moves on round the ring is never copied between batches.
#include <ATen/ATen.h>

#include <utility>

#include "comm/comm.h"
#include "redistribute/boxes.h"
#include "redistribute/lowered_step.h"
#include "redistribute/transport.h"
#include "redistribute/transports/part_transport.h"

namespace shardtensor {
namespace {

int64_t elements_of(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const at::Tensor& t : tensors) n += t.numel();
  return n;
}

// `tensors` as one flat tensor over the memory they already share, where they lie one after
// another in one storage; undefined otherwise. Never in a graph (`comm` records one): a compiled
// graph may give each of them a buffer of its own (Inductor does), where such a view reaches
// past the first.
at::Tensor already_flat(const std::vector<at::Tensor>& tensors, const Comm& comm) {
  if (tensors.empty() || !tensors[0].is_contiguous() || comm.records_graph()) return {};
  int64_t next = tensors[0].storage_offset();
  for (const at::Tensor& t : tensors) {
    if (!t.is_contiguous() || !t.is_alias_of(tensors[0]) || t.storage_offset() != next) return {};
    next += t.numel();
  }
  return tensors[0].as_strided({elements_of(tensors)}, {1}, tensors[0].storage_offset());
}

// The shapes of a block `rows` long along `dim`, for tensors like `like`.
std::vector<std::vector<int64_t>> block_shapes(const std::vector<at::Tensor>& like, int64_t dim, int64_t rows) {
  std::vector<std::vector<int64_t>> shapes;
  for (const at::Tensor& l : like) {
    shapes.push_back(l.sizes().vec());
    shapes.back()[dim] = rows;
  }
  return shapes;
}

// One fresh flat buffer, and views of it shaped `shapes`, one after another.
std::pair<at::Tensor, std::vector<at::Tensor>> one_buffer(const std::vector<std::vector<int64_t>>& shapes,
                                                          const c10::TensorOptions& options, bool zeroed) {
  int64_t total = 0;
  for (const auto& shape : shapes) total += c10::multiply_integers(shape);
  const at::Tensor buffer = zeroed ? at::zeros({total}, options) : at::empty({total}, options);
  std::vector<at::Tensor> views;
  int64_t at = 0;
  for (const auto& shape : shapes) {
    views.push_back(buffer.narrow(0, at, c10::multiply_integers(shape)).view(shape));
    at += views.back().numel();
  }
  return {buffer, views};
}

}  // namespace

std::vector<at::Tensor> views_of_one_buffer(const std::vector<std::vector<int64_t>>& shapes, const c10::TensorOptions& options,
                                            bool zeroed) {
  return one_buffer(shapes, options, zeroed).second;
}

int64_t LoweredStep::widest_block_bytes(const std::vector<at::Tensor>& like) const {
  const int64_t dim = std::get<RingStep>(step_).tensor_dim;
  int64_t row_bytes = 0;
  for (const at::Tensor& t : like) {
    int64_t row = static_cast<int64_t>(t.element_size());  // every dim but the ring's: a rank without rows counts alike
    for (int64_t d = 0; d < t.dim(); ++d)
      if (d != dim) row *= t.size(d);
    row_bytes += row;
  }
  return row_bytes * widest_rows_;
}

// Parts are boxes of one flat dim. Holder and receiver must name a part alike, so every part
// lies at 0; each side's buffer is placed around it (it holds the part at the part's offset in
// that buffer, so its box may begin below 0), as a halo's receiver places its window.
std::vector<std::vector<at::Tensor>> LoweredStep::apply(int64_t batch, const std::vector<std::vector<at::Tensor>>& sent,
                                                        const std::vector<at::Tensor>& like, const DeviceMesh& mesh,
                                                        const StepTransport& how, const std::function<void()>& while_moving) const {
  const RingStep& step = std::get<RingStep>(step_);
  const RingBatch& lowered = ring_batch(batch);
  TORCH_INTERNAL_ASSERT(sent.size() == lowered.sends.size(), to_string(step_), " batch ", batch, " sends ", lowered.sends.size(),
                        " blocks, but was given ", sent.size());
  Comm& comm = mesh.comm(step.mesh_dim);
  const int64_t me = comm.rank(), members = comm.size();
  const c10::TensorOptions options = like.at(0).options();

  // The source: one run per receiver; where this rank sends to one peer only, straight from the
  // tensors if they already lie as one run.
  std::vector<std::vector<at::Tensor>> to_peer(members);
  for (size_t i = 0; i < sent.size(); ++i) {
    const RingTransfer& t = lowered.sends[i];
    TORCH_INTERNAL_ASSERT(t.peer >= 0 && t.peer < members);
    for (const at::Tensor& part : sent[i]) {
      TORCH_INTERNAL_ASSERT(part.size(step.tensor_dim) == t.rows && part.scalar_type() == options.dtype());
      to_peer[t.peer].push_back(part);
    }
  }
  std::vector<int64_t> send_at(members, 0), receivers;
  int64_t total = 0;
  for (int64_t q = 0; q < members; ++q) {
    send_at[q] = total;
    total += elements_of(to_peer[q]);
    if (!to_peer[q].empty()) receivers.push_back(q);
  }
  at::Tensor source = receivers.size() == 1 ? already_flat(to_peer[receivers[0]], comm) : at::Tensor();
  if (source.defined()) {
    send_at[receivers[0]] = 0;
  } else {
    source = at::empty({total}, options);
    for (int64_t q = 0; q < members; ++q) {
      int64_t at = send_at[q];
      for (const at::Tensor& t : to_peer[q]) {
        source.narrow(0, at, t.numel()).view(t.sizes()).copy_(t);
        at += t.numel();
      }
    }
  }

  // The destination: one buffer per sending peer, of which the received blocks are views; the
  // seam fills one: the one sender's, or one for all, copied out after.
  std::vector<std::vector<at::Tensor>> received(lowered.receives.size());
  std::vector<std::vector<std::vector<int64_t>>> shapes_from(members);
  std::vector<std::vector<size_t>> block_of_shape(members);  // per peer: which received block each shape is of
  for (size_t i = 0; i < lowered.receives.size(); ++i) {
    const RingTransfer& t = lowered.receives[i];
    TORCH_INTERNAL_ASSERT(t.peer >= 0 && t.peer < members);
    for (auto& shape : block_shapes(like, step.tensor_dim, t.rows)) {
      shapes_from[t.peer].push_back(std::move(shape));
      block_of_shape[t.peer].push_back(i);
    }
  }
  std::vector<at::Tensor> buffer_from(members);
  std::vector<int64_t> receive_at(members, 0), arriving(members, 0);
  int64_t arriving_total = 0, senders = 0, sender = -1;
  for (int64_t q = 0; q < members; ++q) {
    if (shapes_from[q].empty()) continue;
    auto [buffer, views] = one_buffer(shapes_from[q], options, /*zeroed=*/false);
    for (size_t k = 0; k < views.size(); ++k) received[block_of_shape[q][k]].push_back(std::move(views[k]));
    buffer_from[q] = buffer;
    arriving[q] = buffer.numel();
    receive_at[q] = arriving_total;
    arriving_total += arriving[q];
    if (arriving[q] > 0) {
      ++senders;
      sender = q;
    }
  }
  const bool one_sender = senders == 1;
  const at::Tensor destination = one_sender ? buffer_from[sender] : at::empty({arriving_total}, options);
  if (one_sender) receive_at[sender] = 0;

  std::vector<PeerPart> parts;
  for (int64_t q = 0; q < members; ++q) {
    if (q == me) continue;
    if (const int64_t n = elements_of(to_peer[q]); n > 0) parts.push_back({me, q, Box{{0}, {n}}, Box{{-send_at[q]}, {source.numel()}}, {}});
    if (const int64_t n = arriving[q]; n > 0) {
      const Box part{{0}, {n}};
      parts.push_back({q, me, part, part, Box{{-receive_at[q]}, {destination.numel()}}});
    }
  }
  const int64_t to_self = elements_of(to_peer[me]);
  TORCH_CHECK(to_self == arriving[me], "shardtensor: ", to_string(step_), " batch ", batch, " sends ", to_self,
              " elements to this rank itself but receives ", arriving[me]);
  PartExchange exchange{std::move(parts), source, destination, counted_as(step_)};
  exchange.local_work = [&] {
    if (to_self > 0) destination.narrow(0, receive_at[me], to_self).copy_(source.narrow(0, send_at[me], to_self));
    if (while_moving) while_moving();
  };
  move_parts(comm, how, exchange);
  if (!one_sender)
    for (int64_t q = 0; q < members; ++q)
      if (arriving[q] > 0) buffer_from[q].copy_(destination.narrow(0, receive_at[q], arriving[q]));
  return received;
}

}  // namespace shardtensor
