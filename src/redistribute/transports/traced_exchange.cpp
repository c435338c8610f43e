// Exchanges of parts in a torch.compile graph (part_transport.h: traced_exchange_transport).
//
// While a TracingScope is open (comm/traced_collectives.h), a move has no bytes to move; it is
// recorded as an operator of the graph. The collectives of equal pieces are recorded as torch's
// functional collectives, which Inductor knows. An exchange of parts is recorded as one call of
// the custom operator
//
//     shardtensor::exchange_parts(source, own, comm, parts, destination_shape, reduction,
//                                 transport, collective, counted_as, counts, message_bytes)
//
// for two reasons. Where its transport is PeerMemory or SharedArena (CPU ranks on one host:
// redistribute/transport.h), a Gloo collective in its place measured 2-3x slower than the eager
// step it was traced from (bench/RESULTS.md, "torch.compile against eager"). And what a rank
// sends differs between ranks: as torch's all_to_all_single, a rank that sends nothing passes a
// buffer that depends on no input, so AOTAutograd's partitioners placed that rank's backward
// exchange in its forward graph (or recomputed it) on that rank alone, and the ranks ran their
// collectives in different orders. The operator is an ordered effect (python/shardtensor/
// _traceable.py), which keeps every rank's exchanges in the traced order and in their graph.
//
// Its kernel (CPU and CUDA alike) rebuilds the PartExchange and moves it through the same
// transport as eager mode (its agreement checks, timeouts and fallback to messages included);
// its Meta kernel gives the result's shape to the tracer. The exchange's local_work runs in the graph after it.
//
// The exchange travels through the graph as plain integers: each part as holder, receiver and its
// three boxes; each box as (nothing, rank, offsets..., shape...).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <torch/version.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "comm/c10d_comm.h"
#include "comm/traced_collectives.h"
#include "redistribute/transports/part_transport.h"
#include "redistribute/transports/traced_bytes.h"

namespace shardtensor {
namespace {

void encode_box(const Box& box, std::vector<int64_t>& out) {
  out.push_back(box.nothing ? 1 : 0);
  out.push_back(static_cast<int64_t>(box.shape.size()));
  out.insert(out.end(), box.offsets.begin(), box.offsets.end());
  out.insert(out.end(), box.shape.begin(), box.shape.end());
}

Box decode_box(c10::IntArrayRef in, size_t& at) {
  Box box;
  box.nothing = in[at++] != 0;
  const auto rank = static_cast<size_t>(in[at++]);
  box.offsets.assign(in.begin() + at, in.begin() + at + rank);
  box.shape.assign(in.begin() + at + rank, in.begin() + at + 2 * rank);
  at += 2 * rank;
  return box;
}

std::vector<int64_t> encode_parts(const std::vector<PeerPart>& parts) {
  std::vector<int64_t> out;
  for (const PeerPart& p : parts) {
    out.push_back(p.holder);
    out.push_back(p.receiver);
    encode_box(p.part, out);
    encode_box(p.holder_holds, out);
    encode_box(p.receiver_holds, out);
  }
  return out;
}

std::vector<PeerPart> decode_parts(c10::IntArrayRef in) {
  std::vector<PeerPart> parts;
  for (size_t at = 0; at < in.size();) {
    PeerPart p;
    p.holder = in[at++];
    p.receiver = in[at++];
    p.part = decode_box(in, at);
    p.holder_holds = decode_box(in, at);
    p.receiver_holds = decode_box(in, at);
    parts.push_back(std::move(p));
  }
  return parts;
}

// StepTransport and PartExchange name what they count by static strings; a graph hands them back
// as strings, kept here for the life of the process.
const char* interned(c10::string_view s) {
  static std::mutex mutex;
  static std::set<std::string>* kept = new std::set<std::string>();  // leaked: steps may outlive statics
  std::lock_guard<std::mutex> lock(mutex);
  return kept->emplace(s.data(), s.size()).first->c_str();
}

// The shape exchange_parts returns: the reduction's out (own's shape) or the destination.
std::vector<int64_t> result_shape(const c10::optional<at::Tensor>& own, c10::IntArrayRef destination_shape, c10::IntArrayRef reduction) {
  return reduction.empty() ? destination_shape.vec() : own->sizes().vec();
}

at::Tensor exchange_parts_meta(const at::Tensor& source, const c10::optional<at::Tensor>& own, int64_t, c10::IntArrayRef,
                               c10::IntArrayRef destination_shape, c10::IntArrayRef reduction, int64_t, c10::string_view, c10::string_view,
                               bool, int64_t) {
  return at::empty(result_shape(own, destination_shape, reduction), source.options());
}

// What the graph runs: the exchange rebuilt on this call's tensors and moved as eager mode moves it.
at::Tensor exchange_parts_on_device(const at::Tensor& source, const c10::optional<at::Tensor>& own, int64_t comm_number,
                              c10::IntArrayRef parts, c10::IntArrayRef destination_shape, c10::IntArrayRef reduction, int64_t transport,
                              c10::string_view collective, c10::string_view counted_as, bool counts, int64_t message_bytes) {
  std::shared_ptr<Comm> comm = c10d_comm_numbered(comm_number);
  TORCH_CHECK(comm, "shardtensor: a compiled graph exchanges parts over a group that is gone (its DeviceMesh was destroyed); "
                    "compile the function again for the new mesh.");
  PartExchange exchange{decode_parts(parts), source, at::empty(destination_shape, source.options()), interned(counted_as), counts};
  at::Tensor result = exchange.destination;
  if (!reduction.empty()) {
    TORCH_CHECK(own.has_value() && reduction.size() == 2, "shardtensor::exchange_parts: a reduction needs own and [op, members]");
    result = at::empty(own->sizes(), own->options());
    exchange.reduction = PartReduction{static_cast<ReduceOp>(reduction[0]), *own, result, reduction[1]};
  }
  const StepTransport how{static_cast<TransportKind>(transport), interned(collective), interned(counted_as), message_bytes};
  TracingPause moving;
  move_parts(*comm, how, exchange);
  return result;
}

TORCH_LIBRARY_FRAGMENT(shardtensor, m) {
  const char* schema =
      "exchange_parts(Tensor source, Tensor? own, int comm, int[] parts, int[] destination_shape, int[] reduction, int transport, "
      "str collective, str counted_as, bool counts, int message_bytes) -> Tensor";
#if TORCH_VERSION_MAJOR >= 2
  // The parts address the source by its strides as traced: Inductor must hand it over so.
  m.def(schema, {at::Tag::needs_exact_strides});
#else
  m.def(schema);
#endif
}

TORCH_LIBRARY_IMPL(shardtensor, CPU, m) { m.impl("exchange_parts", TORCH_FN(exchange_parts_on_device)); }
TORCH_LIBRARY_IMPL(shardtensor, CUDA, m) { m.impl("exchange_parts", TORCH_FN(exchange_parts_on_device)); }
TORCH_LIBRARY_IMPL(shardtensor, Meta, m) { m.impl("exchange_parts", TORCH_FN(exchange_parts_meta)); }

// An exchange already recorded in the graph being traced (traced_bytes.h), described by its
// arguments (comm, transport, reduction, parts, shape): the same move of the same bytes again
// takes its result instead of a second exchange. A whole redistribute repeated by a derivative
// is caught before it gets here (execute_redistribute); this catches the moves that are no
// redistribute: a halo or a mid-op reduction that a derivative repeats. Per thread, 32 of them:
// enough for the moves of one operator's backward.
thread_local RecordedMoves<std::vector<int64_t>> recorded_exchanges(32);

// Records the exchange as a shardtensor::exchange_parts node, copies what it receives into the
// exchange's destination (or reduction's out) and runs its local_work. Only while tracing.
class TracedExchangeTransport final : public PartTransport {
 public:
  bool move(Comm& comm, const PartExchange& exchange, const StepTransport& how) const override;
};

}  // namespace

const PartTransport& traced_exchange_transport() {
  static const TracedExchangeTransport transport;
  return transport;
}

bool TracedExchangeTransport::move(Comm& comm, const PartExchange& exchange, const StepTransport& how) const {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("shardtensor::exchange_parts", "");
  std::vector<int64_t> reduction;
  c10::optional<at::Tensor> own;
  if (exchange.reduction) {
    reduction = {static_cast<int64_t>(exchange.reduction->op), exchange.reduction->members};
    own = exchange.reduction->own;
  }
  const std::vector<int64_t> parts = encode_parts(exchange.parts);
  std::vector<int64_t> arguments{comm.number(), static_cast<int64_t>(how.kind), static_cast<int64_t>(reduction.size())};
  arguments.insert(arguments.end(), reduction.begin(), reduction.end());
  arguments.insert(arguments.end(), parts.begin(), parts.end());
  const auto shape = exchange.destination.sizes();
  arguments.insert(arguments.end(), shape.begin(), shape.end());
  const bool reusable = is_traced_piece(exchange.source) && (!own || is_traced_piece(*own));
  std::vector<TracedBytes> read;
  if (reusable) {
    read.emplace_back(exchange.source);
    if (own) read.emplace_back(*own);
  }
  at::Tensor received = reusable ? recorded_exchanges.find(arguments, read) : at::Tensor();
  if (!received.defined()) {
    torch::jit::Stack stack{exchange.source,
                            own,
                            comm.number(),
                            parts,
                            exchange.destination.sizes().vec(),
                            reduction,
                            static_cast<int64_t>(how.kind),
                            std::string(how.collective),
                            std::string(exchange.counted_as),
                            exchange.counts,
                            how.message_bytes};
    op.callBoxed(stack);
    received = stack.at(0).toTensor();
    if (reusable) recorded_exchanges.add(std::move(arguments), std::move(read), received);
  }
  if (exchange.reduction) {
    exchange.reduction->out.copy_(received);
  } else {
    // Only what arrives: the destination may be the source itself (an in-place gather), whose
    // own part the result does not hold.
    const int64_t me = comm.rank();
    for (const PeerPart& p : exchange.parts)
      if (p.receiver == me && !p.part.empty())
        view_of_part(exchange.destination, p.receiver_holds, p.part).copy_(view_of_part(received, p.receiver_holds, p.part));
  }
  if (exchange.local_work) exchange.local_work();
  return true;
}

}  // namespace shardtensor
