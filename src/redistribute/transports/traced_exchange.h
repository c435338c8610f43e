// Peer-memory exchanges in a torch.compile graph: the transport a traced exchange of parts runs
// with where its group's members share memory.
//
// While a TracingScope is open (comm/traced_collectives.h), a move has no bytes to move; it is
// recorded as an operator of the graph. Where the step's transport is Collective or Messages the
// record is torch's functional collectives, which Inductor knows. Where it is PeerMemory or
// SharedArena (CPU ranks on one host: redistribute/transport.h), a Gloo collective in its place
// measured 2-3x slower than the eager step it was traced from (bench/RESULTS.md, "torch.compile
// against eager"), so the record is instead one call of the custom operator
//
//     shardtensor::exchange_parts(source, own, comm, parts, destination_shape, reduction,
//                                 transport, collective, counted_as, counts, message_bytes)
//
// whose CPU kernel rebuilds the PartExchange and moves it through the same transport as eager
// mode (its agreement checks, timeouts and fallback to messages included) and whose Meta kernel
// gives the result's shape to the tracer. The exchange's local_work runs in the graph after it.
#pragma once

namespace shardtensor {

class Comm;
struct PartExchange;
struct StepTransport;

// Records `exchange` over `comm` by `how` (PeerMemory or SharedArena) as a shardtensor::exchange_parts
// node, copies what it receives into the exchange's destination (or reduction's out) and runs
// its local_work. Only while tracing collectives.
void trace_exchange(Comm& comm, const StepTransport& how, const PartExchange& exchange);

}  // namespace shardtensor
