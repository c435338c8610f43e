// DeviceMesh: an n-d array of ranks, with one communicator per slice along each mesh dimension.
//
// A mesh of shape [2, 3] over ranks 0..5 lays them out row-major: rank 4 sits at coordinate
// (1, 1); mesh dim 1 of that rank is the group {3, 4, 5}, mesh dim 0 is {1, 4}. The mesh is a
// cheap-to-copy handle: copies share the topology and the communicators. Two meshes compare
// equal when they have the same shape, the same rank layout and the same device type.
//
// What does not live here: process groups themselves (src/comm, the only code that sees c10d),
// and anything about tensors (spec.h).
#pragma once

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace c10d {
class ProcessGroup;
}

namespace shardtensor {

class Comm;  // src/comm/comm.h: the collectives a mesh dimension offers

enum class CommBackend { Auto, Gloo, Nccl };

struct MeshOptions {
  // "cpu" (Gloo) or "cuda" (NCCL when libtorch has it); local tensors live on this device type.
  std::string device_type = "cpu";
  // Auto picks Gloo for cpu and NCCL for cuda.
  CommBackend backend = CommBackend::Auto;
  // A collective on this mesh that waits longer than this raises on the ranks that wait, so an
  // error on one rank never leaves the others hanging. Default: $SHARDTENSOR_TIMEOUT_S, else 300 s.
  std::chrono::milliseconds timeout = default_timeout();

  static std::chrono::milliseconds default_timeout();
};

class DeviceMesh {
 public:
  struct Impl;

  // The usual entry point: a mesh of `shape` over all ranks of the world, laid out in rank order.
  // The product of `shape` must equal the world size. `dim_names` is empty or one name per dim.
  // Every rank must create the same meshes in the same order (group names come from a counter).
  static DeviceMesh create(std::vector<int64_t> shape, std::vector<std::string> dim_names = {},
                           const MeshOptions& options = {});

  // A mesh with an explicit layout: `ranks` lists the global rank at every coordinate,
  // row-major; distinct ranks of the world. It may leave ranks out (DTensor's
  // DeviceMesh("cpu", [0, 2])): those ranks call it too, in the same order as the others, and
  // get a mesh that does not include them (see includes_this_rank).
  static DeviceMesh from_ranks(std::vector<int64_t> shape, std::vector<int64_t> ranks,
                               std::vector<std::string> dim_names = {}, const MeshOptions& options = {});

  // A mesh over process groups the caller already has: `groups[d]` is the group of this rank's
  // slice along mesh dim d, whose group ranks follow the mesh coordinate along d.
  // For meshes of 2 or more dims, `mesh_group` is a group over all ranks of the mesh whose
  // group rank is the row-major position; without it, redistributions that move data across
  // several mesh dims at once raise.
  static DeviceMesh from_process_groups(std::vector<int64_t> shape, std::vector<int64_t> ranks,
                                        std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> groups,
                                        std::vector<std::string> dim_names = {},
                                        const MeshOptions& options = {},
                                        c10::intrusive_ptr<c10d::ProcessGroup> mesh_group = {});

  // A mesh that knows its layout but has no communicators: for planning, rule and spec tests.
  // Any attempt to communicate on it raises. `device_type` ("cpu" or "cuda") is what plans see.
  static DeviceMesh without_comms(std::vector<int64_t> shape, int64_t my_rank,
                                  std::vector<std::string> dim_names = {}, const std::string& device_type = "cpu");

  int64_t ndim() const;
  const std::vector<int64_t>& shape() const;
  int64_t size(int64_t mesh_dim) const;
  int64_t size() const;  // number of ranks in the mesh
  const std::vector<std::string>& dim_names() const;
  int64_t mesh_dim(const std::string& name) const;  // raises for an unknown name

  int64_t rank() const;                              // this process's global rank
  // Whether this process is one of the mesh's ranks. A rank outside it holds no shard of the
  // mesh's tensors: their local pieces are empty (zero in every dim; a 0-d tensor's is a 0-d
  // zero), ops on them keep global shapes and placements and run nothing, redistributes move
  // nothing, and what must read values or communicate (item(), scatter_tensor, a checkpoint)
  // raises, naming the mesh. DTensor's get_coordinate() is None there.
  bool includes_this_rank() const;
  const std::vector<int64_t>& coordinate() const;    // this process's coordinate; raises outside the mesh
  std::vector<int64_t> coordinate_of(int64_t global_rank) const;
  int64_t rank_at(const std::vector<int64_t>& coordinate) const;
  const std::vector<int64_t>& ranks() const;         // row-major rank layout

  // The 1-D mesh along `mesh_dim` through this rank; it shares this mesh's communicator.
  // Raises outside the mesh.
  DeviceMesh submesh(int64_t mesh_dim) const;
  DeviceMesh submesh(const std::string& dim_name) const;
  // For a submesh: the mesh it was taken from and which dim of it; nullopt otherwise.
  std::optional<std::pair<DeviceMesh, int64_t>> parent() const;
  // The mesh of this mesh's dims `dims`, in that order, through this rank (the other dims at
  // this rank's coordinate), over this mesh's groups per dim: dims {1, 0} of a ("dp", "tp")
  // mesh is the ("tp", "dp") mesh fully_shard nests data parallelism in. Unless `dims` is every
  // dim in order (this mesh), it has no mesh-wide group: moves that cross one dim at a time run
  // on it, mesh_comm() raises. Raises outside the mesh.
  DeviceMesh of_dims(const std::vector<int64_t>& dims) const;

  const std::string& device_type() const;
  // The device of this rank's local tensors: cpu, or on a "cuda" mesh cuda:LOCAL_RANK (modulo
  // the GPUs this process sees), whatever the current CUDA device is.
  c10::Device device() const;
  std::chrono::milliseconds timeout() const;
  bool has_comms() const;
  Comm& comm(int64_t mesh_dim) const;  // raises on a mesh built without_comms
  // The group of every rank of the mesh (group rank = row-major position); for 1-D meshes the
  // same group as comm(0). Redistribution exchanges arbitrary boxes through it.
  Comm& mesh_comm() const;

  // Equal: the same shape, ranks, names and device type, whatever groups each runs on.
  bool operator==(const DeviceMesh& other) const;
  // Equal, and over the same communicators (a submesh shares its parent's). What was lowered
  // for one mesh (a kernel's halo, its mid-op reductions) may run on the other only then: a
  // mesh built again over new groups, after a failure left the old ones unusable, must not.
  bool same_groups(const DeviceMesh& other) const;
  bool operator!=(const DeviceMesh& other) const { return !(*this == other); }
  size_t hash() const;
  std::string to_string() const;  // "mesh(2x2)" or "mesh(dp=2 x tp=2)"

  explicit DeviceMesh(std::shared_ptr<const Impl> impl);

 private:
  // Raises, saying that this rank `consequence` ("cannot communicate on it"), outside the mesh.
  void check_includes_this_rank(const char* consequence) const;

  std::shared_ptr<const Impl> impl_;
};

std::ostream& operator<<(std::ostream& os, const DeviceMesh& mesh);

// This process's place in the world, read from the environment (torchrun or mpirun variables;
// a single-process world when neither is set).
int64_t world_rank();
int64_t world_size();

// Drops shardtensor's references to every c10d process group its meshes use, so that their
// owner (torch.distributed.destroy_process_group, or the end of the process) destroys them
// while c10d still runs, not during static destruction. Meshes that exist raise on their next
// collective. The Python package calls it at interpreter exit.
void release_communicators();

// Whether this build of shardtensor can create NCCL meshes (libtorch was a CUDA build with
// c10d's NCCL process group when shardtensor was compiled). Says nothing about a GPU being
// present: see torch::cuda::is_available().
bool built_with_nccl();

}  // namespace shardtensor
