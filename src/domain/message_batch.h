// A batch of point-to-point messages among the members of one mesh dim's group (ring
// attention's key and gradient passes), moved as one exchange of parts through the transport
// seam (redistribute/transports/part_transport.h), so that the transport the options in force
// choose carries it: peer memory or the shared arena on one host, Gloo messages or one
// all_to_all elsewhere, as for a redistribute step or a halo.
//
// What a member sends to one peer travels as one part: its tensors one after another, in the
// order both sides listed them. Tensors that already lie one after another in one buffer (what
// an earlier batch received, say) travel from there; others are packed first. What arrives from
// a peer lands in one buffer, of which receive() hands out the views, so a block that moves on
// round a ring is never copied between batches.
// Every member of the group runs every batch, in the same order, even with nothing to move.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "shardtensor/device_mesh.h"

namespace shardtensor {

// Tensors of `shapes` that are views of one fresh flat buffer (zeros where `zeroed`), and that
// buffer: what a batch sends on as it lies.
std::pair<at::Tensor, std::vector<at::Tensor>> views_of_one_buffer(const std::vector<std::vector<int64_t>>& shapes,
                                                                   const c10::TensorOptions& options, bool zeroed = false);

class MessageBatch {
 public:
  // A batch over `mesh_dim`'s group, counted by CommDebugMode as `counted_as`. `widest_bytes`,
  // the same on every member (the layout's, not this rank's), picks the transport, as a halo's
  // widest window does. Every tensor of the batch has `options`' dtype and device.
  MessageBatch(const DeviceMesh& mesh, int64_t mesh_dim, const char* counted_as, int64_t widest_bytes, const c10::TensorOptions& options);

  // `tensor` goes to group rank `to` (this rank itself too: that copy is local).
  void send(int64_t to, const at::Tensor& tensor);
  // Tensors of `shapes`, views of one fresh buffer, that hold what group rank `from` sends (in
  // the order it sends them) once run() returns.
  std::vector<at::Tensor> receive(int64_t from, const std::vector<std::vector<int64_t>>& shapes);

  // Moves the batch; `while_moving` runs once this member's parts are posted (its compute, say).
  // Raises on every member where they disagree on what moves or one is gone (the transports'
  // checks).
  void run(const std::function<void()>& while_moving = {});

 private:
  struct Arrival {
    int64_t from;
    at::Tensor buffer;  // flat
  };
  const DeviceMesh& mesh_;
  int64_t mesh_dim_;
  const char* counted_as_;
  int64_t widest_bytes_;
  c10::TensorOptions options_;
  std::vector<std::vector<at::Tensor>> sends_;  // per group rank, in call order
  std::vector<Arrival> arrivals_;               // in call order
};

}  // namespace shardtensor
