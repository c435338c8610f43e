#include "domain/message_batch.h"

#include <ATen/ATen.h>

#include <utility>

#include "comm/comm.h"
#include "redistribute/boxes.h"
#include "redistribute/transport.h"
#include "redistribute/transports/part_transport.h"
#include "shardtensor/tracing.h"

namespace shardtensor {
namespace {

int64_t elements_of(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const at::Tensor& t : tensors) n += t.numel();
  return n;
}

// `tensors` as one flat tensor over the memory they already share, where they lie one after
// another in one storage; undefined otherwise. Never while tracing: a compiled graph may give
// each of them a buffer of its own (Inductor does), where such a view reaches past the first.
at::Tensor already_flat(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty() || !tensors[0].is_contiguous() || tracing_collectives()) return {};
  int64_t next = tensors[0].storage_offset();
  for (const at::Tensor& t : tensors) {
    if (!t.is_contiguous() || !t.is_alias_of(tensors[0]) || t.storage_offset() != next) return {};
    next += t.numel();
  }
  return tensors[0].as_strided({elements_of(tensors)}, {1}, tensors[0].storage_offset());
}

}  // namespace

std::pair<at::Tensor, std::vector<at::Tensor>> views_of_one_buffer(const std::vector<std::vector<int64_t>>& shapes,
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

MessageBatch::MessageBatch(const DeviceMesh& mesh, int64_t mesh_dim, const char* counted_as, int64_t widest_bytes,
                           const c10::TensorOptions& options)
    : mesh_(mesh), mesh_dim_(mesh_dim), counted_as_(counted_as), widest_bytes_(widest_bytes), options_(options),
      sends_(mesh.size(mesh_dim)) {}

void MessageBatch::send(int64_t to, const at::Tensor& tensor) {
  TORCH_INTERNAL_ASSERT(to >= 0 && to < static_cast<int64_t>(sends_.size()) && tensor.scalar_type() == options_.dtype());
  sends_[to].push_back(tensor);
}

std::vector<at::Tensor> MessageBatch::receive(int64_t from, const std::vector<std::vector<int64_t>>& shapes) {
  TORCH_INTERNAL_ASSERT(from >= 0 && from < static_cast<int64_t>(sends_.size()));
  auto [buffer, views] = views_of_one_buffer(shapes, options_);
  arrivals_.push_back({from, buffer});
  return views;
}

// Parts are boxes of one flat dim. Holder and receiver must name a part alike, so every part
// lies at 0; each side's buffer is placed around it (it holds the part at the part's offset in
// that buffer, so its box may begin below 0), as a halo's receiver places its window.
void MessageBatch::run(const std::function<void()>& while_moving) {
  Comm& comm = mesh_.comm(mesh_dim_);
  const int64_t me = comm.rank(), members = comm.size();
  // The source: one run per receiver; where this rank sends to one peer only, straight from the
  // tensors if they already lie as one run.
  std::vector<int64_t> send_at(members, 0), receivers;
  int64_t total = 0;
  for (int64_t q = 0; q < members; ++q) {
    send_at[q] = total;
    total += elements_of(sends_[q]);
    if (!sends_[q].empty()) receivers.push_back(q);
  }
  at::Tensor source = receivers.size() == 1 ? already_flat(sends_[receivers[0]]) : at::Tensor();
  if (source.defined()) {
    send_at[receivers[0]] = 0;
  } else {
    source = at::empty({total}, options_);
    for (int64_t q = 0; q < members; ++q) {
      int64_t at = send_at[q];
      for (const at::Tensor& t : sends_[q]) {
        source.narrow(0, at, t.numel()).view(t.sizes()).copy_(t);
        at += t.numel();
      }
    }
  }
  // The destination: the one arrival's buffer, or one for all, copied out after.
  std::vector<int64_t> receive_at(members, 0), received(members, 0);
  total = 0;
  for (int64_t q = 0; q < members; ++q) {
    receive_at[q] = total;
    for (const Arrival& a : arrivals_)
      if (a.from == q) received[q] += a.buffer.numel();
    total += received[q];
  }
  const bool one_arrival = arrivals_.size() == 1;
  const at::Tensor destination = one_arrival ? arrivals_[0].buffer : at::empty({total}, options_);
  if (one_arrival) receive_at[arrivals_[0].from] = 0;

  std::vector<PeerPart> parts;
  for (int64_t q = 0; q < members; ++q) {
    if (q == me) continue;
    if (const int64_t n = elements_of(sends_[q]); n > 0)
      parts.push_back({me, q, Box{{0}, {n}}, Box{{-send_at[q]}, {source.numel()}}, {}});
    if (const int64_t n = received[q]; n > 0) {
      const Box part{{0}, {n}};
      parts.push_back({q, me, part, part, Box{{-receive_at[q]}, {destination.numel()}}});
    }
  }
  const int64_t to_self = elements_of(sends_[me]);
  TORCH_CHECK(to_self == received[me], "shardtensor: a message batch (", counted_as_, ") sends ", to_self,
              " elements to this rank itself but receives ", received[me]);
  PartExchange exchange{std::move(parts), source, destination, counted_as_};
  exchange.local_work = [&] {
    if (to_self > 0) destination.narrow(0, receive_at[me], to_self).copy_(source.narrow(0, send_at[me], to_self));
    if (while_moving) while_moving();
  };
  // Point to point: where no memory is shared, messages (Comm::start_messages; a backend without
  // messages of its own carries them in one all_to_all), never an all_to_all that packs and
  // unpacks every block: a ring holds two blocks, not four.
  StepTransport how = exchange_transport(mesh_, widest_bytes_, options_.device().is_cpu(), counted_as_);
  if (how.kind == TransportKind::Collective) how.kind = TransportKind::Messages;
  move_parts(comm, how, exchange);
  if (one_arrival) return;
  std::vector<int64_t> at = receive_at;
  for (const Arrival& a : arrivals_) {
    a.buffer.copy_(destination.narrow(0, at[a.from], a.buffer.numel()));
    at[a.from] += a.buffer.numel();
  }
}

}  // namespace shardtensor
