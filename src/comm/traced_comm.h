// A group's communicator while torch.compile traces: its collectives are recorded as torch's
// functional collectives (comm/traced_collectives.h) instead of moving bytes.
//
// The mesh hands it out in place of the group's eager communicator while a TracingScope is open
// on the thread (DeviceMesh::comm, mesh_comm: through comm_for_this_thread, which this layer
// gives the mesh when the library loads, the one place that reads the scope to pick a Comm). Transports above ask the Comm they were handed whether it
// records a graph (Comm::records_graph) and record their own moves then as graph operators
// (redistribute/transports/part_transport.h); nothing below comm/ reads the scope to decide how
// to move. It shares its eager communicator's number (by which a graph's operators find that
// communicator when they run) and attachments (the peer-memory state, probed for real).
#pragma once

#include "comm/comm.h"
#include "comm/traced_collectives.h"

namespace shardtensor {

class TracedComm final : public Comm {
 public:
  TracedComm(Comm& eager, TracedCollectives collectives);

  int64_t rank() const override { return eager_.rank(); }
  int64_t size() const override { return eager_.size(); }
  const std::vector<int64_t>& global_ranks() const override { return eager_.global_ranks(); }
  std::string backend_name() const override { return eager_.backend_name(); }
  std::chrono::milliseconds timeout() const override { return eager_.timeout(); }
  Comm& eager() override { return eager_; }
  bool records_graph() const override { return true; }

  void all_gather(const at::Tensor& input, const at::Tensor& output) override;
  void all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  void broadcast(const at::Tensor& tensor, int64_t root) override;
  void barrier() override {}  // a graph orders its collectives by their data alone
  void all_to_all(const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                  const std::vector<int64_t>& input_splits) override;
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  // Comm's default batch: its messages as one all_to_all (a graph holds no point-to-point ones).

 private:
  Comm& eager_;
  TracedCollectives collectives_;
};

// `comm`, or its traced form while a TracingScope is open on this thread and it has one (a
// one-rank group's local copies are traced as they are).
Comm& comm_for_this_thread(Comm& comm);

}  // namespace shardtensor
