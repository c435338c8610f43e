// Shared by the distributed tests: the meshes of this world size, created once and in the same
// order on every rank (mesh creation is collective).
#pragma once

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "redistribute/transports/peer_memory/peer_memory.h"
#include "redistribute/transports/peer_memory/copies.h"
#include "redistribute/transport.h"
#include "shardtensor/shardtensor.h"
#include "support/reference.h"

namespace shardtensor::testing {

// This rank's term of a Partial value: v split over each Partial mesh dim in turn so that the
// reduction gives v back exactly (in double): sum: v - (1+..+n-1) at 0 and c elsewhere;
// avg: v + c - (n-1)/2; max: v - c; min: v + c; product: v at 0 and 1 elsewhere.
inline at::Tensor partial_term(at::Tensor v, const DeviceMesh& mesh, const Placements& ps) {
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (!ps[m].is_partial()) continue;
    const double c = static_cast<double>(mesh.coordinate()[m]), n = static_cast<double>(mesh.size(m));
    switch (ps[m].reduce_op) {
      case ReduceOp::Sum: v = c == 0 ? v - (n - 1) * n / 2 : at::full_like(v, c); break;
      case ReduceOp::Avg: v = v + (c - (n - 1) / 2); break;
      case ReduceOp::Max: v = v - c; break;
      case ReduceOp::Min: v = v + c; break;
      case ReduceOp::Product: v = c == 0 ? v : at::ones_like(v); break;
    }
  }
  return v.contiguous();
}

inline const std::vector<DeviceMesh>& test_meshes() {
  static const std::vector<DeviceMesh> meshes = [] {
    std::vector<DeviceMesh> out;
    for (const auto& shape : mesh_shapes_for(world_size())) out.push_back(DeviceMesh::create(shape));
    return out;
  }();
  return meshes;
}

// The first of them: the world's ranks along one dimension.
inline const DeviceMesh& mesh_1d() { return test_meshes().front(); }

inline int64_t total(const std::vector<int64_t>& sizes) { return std::accumulate(sizes.begin(), sizes.end(), int64_t{0}); }

// Standard normal doubles after a fixed seed: the same on every rank.
inline at::Tensor draw_double(const std::vector<int64_t>& shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape, at::kDouble);
}

// Whether this machine's kernel forbids the ranks of `comm` to read or write each other's memory
// (a seccomp profile or Yama rule refusing process_vm_readv/writev): peer memory is then unavailable by
// the machine's choice, not by a bug, and tests of it skip, saying so. Collective over `comm`
// (it may run the probe), so every rank decides alike.
inline bool kernel_forbids_peer_memory(Comm& comm) {
  if (comm.size() == 1 || peer_memory_of(comm)) return false;
  const std::string& why = why_no_peer_memory(comm);
  bool forbidden = false;
  for (const char* refusal : {"Operation not permitted", "Function not implemented", "Permission denied"})
    forbidden = forbidden || why.find(refusal) != std::string::npos;
  at::Tensor any = at::tensor(std::vector<int64_t>{forbidden ? 1 : 0}, at::kLong);
  comm.all_reduce(any, ReduceOp::Max);
  return any.item<int64_t>() == 1;
}

// The executor's transport while it lives: copies through the peers' memory for every size
// (where the group is on one host, as here), messages only, or native c10d collectives (what
// NCCL gets). Every rank must make the same.
class UseTransport {
 public:
  enum Kind { kMemory, kMessages, kCollectives };
  explicit UseTransport(Kind kind) : scope_(options_of(kind)) {}

 private:
  static TransportOptions options_of(Kind kind) {
    TransportOptions options;
    options.transport = kind == kCollectives ? TransportPreference::Collectives : TransportPreference::Auto;
    options.peer_memory = kind == kMemory && peer_memory_enabled();
    options.peer_copy_bytes = kind == kMemory ? 0 : kDefaultPeerCopyBytes;
    return options;
  }
  TransportOptionsScope scope_;
};

}  // namespace shardtensor::testing
