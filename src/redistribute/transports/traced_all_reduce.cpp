// An all-reduce through peer memory or messages in a torch.compile graph: one call of
//
//     shardtensor::all_reduce_parts(local, comm, op, transport, message_bytes) -> Tensor
//
// whose kernel runs eager mode's all_reduce_on (executor.h) on the call's tensor. Traced as the
// two exchanges it makes (transports/traced_exchange.cpp), the reduced chunk would be copied
// into a buffer of the whole tensor between them and the gathered chunks out of it again:
// functionalized, those copies are masked passes over the whole tensor, which made a 1 MiB
// all-reduce in a graph take twice eager mode's time. Like exchange_parts, the operator is an
// ordered effect (python/shardtensor/_traceable.py): every rank runs its calls in the traced order.
// And like an exchange (transports/traced_bytes.h), an all-reduce a derivative repeats on the same
// traced bytes takes the first one's result instead of a second call.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "comm/c10d_comm.h"
#include "comm/traced_collectives.h"
#include "redistribute/executor.h"
#include "redistribute/transports/traced_bytes.h"

namespace shardtensor {
namespace {

at::Tensor all_reduce_parts_on_device(const at::Tensor& local, int64_t comm_number, int64_t op, int64_t transport,
                                      int64_t message_bytes) {
  std::shared_ptr<Comm> comm = c10d_comm_numbered(comm_number);
  TORCH_CHECK(comm, "shardtensor: a compiled graph all-reduces over a group that is gone (its DeviceMesh was destroyed); "
                    "compile the function again for the new mesh.");
  TracingPause moving;
  return all_reduce_on(*comm, local, static_cast<ReduceOp>(op),
                       StepTransport{static_cast<TransportKind>(transport), "all_reduce", "all_reduce", message_bytes});
}

at::Tensor all_reduce_parts_meta(const at::Tensor& local, int64_t, int64_t, int64_t, int64_t) {
  return at::empty(local.sizes(), local.options());
}

TORCH_LIBRARY_FRAGMENT(shardtensor, m) {
  m.def("all_reduce_parts(Tensor local, int comm, int op, int transport, int message_bytes) -> Tensor");
}

TORCH_LIBRARY_IMPL(shardtensor, CPU, m) { m.impl("all_reduce_parts", TORCH_FN(all_reduce_parts_on_device)); }
TORCH_LIBRARY_IMPL(shardtensor, CUDA, m) { m.impl("all_reduce_parts", TORCH_FN(all_reduce_parts_on_device)); }
TORCH_LIBRARY_IMPL(shardtensor, Meta, m) { m.impl("all_reduce_parts", TORCH_FN(all_reduce_parts_meta)); }

// The all-reduces recorded in the graph being traced, by (comm, op, transport, message bytes), per
// thread: as many as traced_exchange.cpp keeps of exchanges.
thread_local RecordedMoves<std::vector<int64_t>> recorded_all_reduces(32);

}  // namespace

at::Tensor traced_all_reduce(Comm& comm, const at::Tensor& local, ReduceOp op, const StepTransport& how) {
  static const auto call = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("shardtensor::all_reduce_parts", "")
                               .typed<at::Tensor(const at::Tensor&, int64_t, int64_t, int64_t, int64_t)>();
  std::vector<int64_t> key{comm.number(), static_cast<int64_t>(op), static_cast<int64_t>(how.kind), how.message_bytes};
  const bool reusable = is_traced_piece(local);
  std::vector<TracedBytes> read;
  if (reusable) read.emplace_back(local);
  // A copy of the earlier result: callers get a fresh tensor, which they may write.
  if (at::Tensor earlier = reusable ? recorded_all_reduces.find(key, read) : at::Tensor(); earlier.defined()) return earlier.clone();
  at::Tensor result = call.call(local, key[0], key[1], key[2], key[3]);
  if (reusable) recorded_all_reduces.add(std::move(key), std::move(read), result);
  return result;
}

}  // namespace shardtensor
