// Collectives on traced pieces: how a ShardTensor's moves appear in a torch.compile graph.
//
// Under torch.compile, the Python traceable wrapper (python/shardtensor/_traceable.py) runs
// shardtensor's C++ dispatch on local pieces that hold no bytes (dynamo's fake tensors,
// AOTAutograd's functional ones). Propagation, planning and the kernels run as in eager mode;
// only the bytes cannot move. While a TracingScope is open on the thread, the mesh hands out each
// group's TracedComm (comm/traced_comm.h), whose every collective is recorded instead as torch's
// functional collective of the same meaning (torch.ops._c10d_functional: all_reduce,
// all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, broadcast), followed by its wait_tensor, so the compiled graph holds local ATen ops and
// collectives that Inductor can schedule. Exchanges of parts (halos, uneven steps, the ring's
// batches, peer memory) are recorded as shardtensor's own ordered operator instead
// (redistribute/transports/part_transport.h: move_parts, traced_exchange.cpp). Nothing here
// runs outside tracing, and nothing is counted by shardtensor's CommDebugMode: a trace moves no
// bytes, and a compiled graph's collectives run as torch's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtensor/placement.h"

namespace at {
class Tensor;
}

namespace shardtensor {

// Whether this thread is tracing (a TracingScope is open): asked where a move is lowered.
bool tracing_collectives();

// Open while the traceable wrapper runs one operator on traced pieces: every move is then
// recorded as an operator of the graph instead of moving bytes (torch's functional collective of
// the same meaning, or, for a peer-memory step, shardtensor::exchange_parts).
class TracingScope {
 public:
  TracingScope();
  ~TracingScope();
  TracingScope(const TracingScope&) = delete;
  TracingScope& operator=(const TracingScope&) = delete;

 private:
  bool previous_;
};

// Closes this thread's TracingScope for its life: an operator that a graph recorded and that now
// runs, inside a region that still traces (dynamo's eager backend runs graphs on real pieces),
// moves its bytes as eager mode does.
class TracingPause {
 public:
  TracingPause();
  ~TracingPause();
  TracingPause(const TracingPause&) = delete;
  TracingPause& operator=(const TracingPause&) = delete;

 private:
  bool previous_;
};

// The functional collectives over one torch.distributed group, by its registered name. Each
// returns a new tensor (the inputs are untouched), as the functional ops do.
class TracedCollectives {
 public:
  // `group_name`: the group's name in torch.distributed's registry (empty: a group that
  // torch.distributed did not make, which cannot be traced: every call raises saying so).
  TracedCollectives(std::string group_name, int64_t group_size, std::string described_as);

  at::Tensor all_reduce(const at::Tensor& input, ReduceOp op) const;
  // [group_size * input.size(0), ...]: every member's input, in group-rank order, along dim 0.
  at::Tensor all_gather(const at::Tensor& input) const;
  // `input` holds group_size blocks along dim 0; returns this member's block reduced.
  at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op) const;
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& output_splits,
                        const std::vector<int64_t>& input_splits) const;
  at::Tensor broadcast(const at::Tensor& input, int64_t root) const;

 private:
  const std::string& name() const;

  std::string group_name_;
  int64_t group_size_;
  std::string described_as_;  // "the group of global ranks [0, 1]", for errors
};

}  // namespace shardtensor
