// The shared state behind a DeviceMesh handle. Visible to src/mesh (topology) and src/comm
// (which fills in the communicators); nothing above those layers includes it.
#pragma once

#include <memory>
#include <vector>

#include "shardtensor/device_mesh.h"

namespace shardtensor {

struct DeviceMesh::Impl {
  std::vector<int64_t> shape;
  std::vector<std::string> dim_names;     // empty, or one per mesh dim
  std::vector<int64_t> ranks;             // global rank at each coordinate, row-major
  int64_t rank = 0;                       // this process's global rank
  std::vector<int64_t> coordinate;        // this process's coordinate; empty outside the mesh (a subset of the world)
  std::vector<std::shared_ptr<Comm>> comms;  // one per mesh dim; empty for without_comms meshes
  std::shared_ptr<Comm> mesh_comm;           // all ranks of the mesh, group rank = row-major position
  std::string device_type = "cpu";
  c10::Device device = c10::Device(c10::kCPU);  // where this rank's local tensors live
  std::chrono::milliseconds timeout{0};
  size_t hash = 0;
  std::shared_ptr<const Impl> parent;  // what submesh() took this mesh from (null otherwise)
  int64_t parent_dim = -1;             // ... and which of its dims this mesh is
};

// Validates the layout (shape positive, ranks distinct ranks of the world, names unique;
// my_rank may lie outside it) and fills the topology fields and the hash. Raises with a message
// that names what was passed; every rank passes the same arguments, so every rank raises.
std::shared_ptr<DeviceMesh::Impl> make_mesh_topology(std::vector<int64_t> shape,
                                                     std::vector<int64_t> ranks,
                                                     std::vector<std::string> dim_names,
                                                     int64_t my_rank, int64_t world_size);

// Which communicator DeviceMesh::comm and mesh_comm hand out for a group's own: that one, or
// while torch.compile traces on this thread its traced form. comm/ (above this layer) sets it
// when the library loads (comm/traced_comm.cpp); unset, the group's own.
using CommHandOut = Comm& (*)(Comm& group_comm);
void set_comm_hand_out(CommHandOut hand_out);

// The coordinate of row-major position `position` in a mesh of `shape`.
std::vector<int64_t> coordinate_at(const std::vector<int64_t>& shape, int64_t position);

// Global ranks of the slice through `coordinate` along `mesh_dim`, in coordinate order.
std::vector<int64_t> ranks_along(const DeviceMesh::Impl& mesh, int64_t mesh_dim,
                                 const std::vector<int64_t>& coordinate);

}  // namespace shardtensor
