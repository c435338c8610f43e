// DeviceMesh over real process groups: coordinates, per-dim groups, mesh-wide gathers, explicit
// rank layouts and meshes over the caller's own process groups.
#define SHARDTENSOR_COMPAT_C10D  // compat::process_group_over
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/comm.h"
#include "comm/mesh_collectives.h"
#include "dist/dist_fixture.h"
#include "util/torch_compat.h"

using namespace shardtensor;
using namespace shardtensor::testing;

TEST(DistMesh, EveryMeshDimGroupIsTheSliceThroughThisRank) {
  for (const DeviceMesh& mesh : test_meshes()) {
    SCOPED_TRACE(mesh.to_string());
    EXPECT_EQ(mesh.size(), world_size());
    EXPECT_EQ(mesh.rank(), world_rank());
    EXPECT_EQ(mesh.coordinate(), mesh.coordinate_of(world_rank()));
    for (int64_t d = 0; d < mesh.ndim(); ++d) {
      EXPECT_EQ(mesh.comm(d).size(), mesh.size(d));
      EXPECT_EQ(mesh.comm(d).rank(), mesh.coordinate()[d]);
      EXPECT_EQ(mesh.comm(d).global_ranks(), mesh.submesh(d).ranks());
    }
  }
}

TEST(DistMesh, AllReduceOnAMeshDimSumsOverItsSlice) {
  for (const DeviceMesh& mesh : test_meshes()) {
    for (int64_t d = 0; d < mesh.ndim(); ++d) {
      at::Tensor t = at::full({3}, static_cast<double>(world_rank()), at::kDouble);
      mesh.comm(d).all_reduce(t, ReduceOp::Sum);
      const DeviceMesh slice = mesh.submesh(d);
      int64_t expected = 0;
      for (int64_t r : slice.ranks()) expected += r;
      EXPECT_EQ(t[2].item<double>(), expected) << mesh << " mesh dim " << d;
      at::Tensor m = at::full({1}, static_cast<double>(world_rank()), at::kDouble);
      mesh.comm(d).all_reduce(m, ReduceOp::Max);
      EXPECT_EQ(m.item<double>(), *std::max_element(slice.ranks().begin(), slice.ranks().end())) << mesh << " mesh dim " << d;
    }
  }
}

TEST(DistMesh, AllGatherOverMeshIsInRowMajorCoordinateOrder) {
  for (const DeviceMesh& mesh : test_meshes()) {
    at::Tensor mine = at::tensor(std::vector<int64_t>{world_rank(), 10 * world_rank()}, at::kLong);
    at::Tensor all = all_gather_over_mesh(mesh, mine);
    ASSERT_EQ(all.sizes().vec(), (std::vector<int64_t>{mesh.size(), 2}));
    for (int64_t i = 0; i < mesh.size(); ++i) {
      EXPECT_EQ(all[i][0].item<int64_t>(), mesh.ranks()[i]) << mesh;
      EXPECT_EQ(all[i][1].item<int64_t>(), 10 * mesh.ranks()[i]) << mesh;
    }
  }
}

TEST(DistMesh, ExplicitRankLayoutReversed) {
  std::vector<int64_t> reversed;
  for (int64_t r = world_size() - 1; r >= 0; --r) reversed.push_back(r);
  DeviceMesh mesh = DeviceMesh::from_ranks({world_size()}, reversed, {"x"});
  EXPECT_EQ(mesh.coordinate(), (std::vector<int64_t>{world_size() - 1 - world_rank()}));
  at::Tensor all = all_gather_over_mesh(mesh, at::tensor(std::vector<int64_t>{world_rank()}, at::kLong));
  for (int64_t i = 0; i < world_size(); ++i) EXPECT_EQ(all[i][0].item<int64_t>(), world_size() - 1 - i);
  EXPECT_EQ(mesh.submesh("x").comm(0).size(), world_size());
}

TEST(DistMesh, MeshOverTheCallersOwnProcessGroups) {
  // The caller's groups: one Gloo group over the whole world, formed through a FileStore, as
  // the ProcessGroup a torch.distributed program holds (on 2.x a front over the Gloo backend).
  const std::string path = "/tmp/shardtensor_pg_test_" + std::string(std::getenv("MASTER_PORT") ? std::getenv("MASTER_PORT") : "single");
  auto store = c10::make_intrusive<c10d::FileStore>(path, static_cast<int>(world_size()));
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(world_rank()), static_cast<int>(world_size()), opts);
  c10::intrusive_ptr<c10d::ProcessGroup> group = compat::process_group_over(gloo, store, c10::kCPU);
  std::vector<int64_t> ranks;
  for (int64_t r = 0; r < world_size(); ++r) ranks.push_back(r);
  DeviceMesh mesh = DeviceMesh::from_process_groups({world_size()}, ranks, {group});
  at::Tensor t = at::ones({2});
  mesh.comm(0).all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(t[0].item<float>(), world_size());
  mesh.comm(0).barrier();
  if (world_rank() == 0) std::remove(path.c_str());
  EXPECT_ERROR_CONTAINS(DeviceMesh::from_process_groups({world_size()}, ranks, {}), "0 process groups given for a 1-d mesh");
}

TEST(DistMesh, BadMeshShapesRaiseOnEveryRankBeforeCommunicating) {
  EXPECT_ERROR_CONTAINS(DeviceMesh::create({world_size() + 1}), "holds", "but the world has");
  EXPECT_ERROR_CONTAINS(DeviceMesh::create({world_size(), 2}), "but the world has");
  std::vector<int64_t> repeated(world_size(), 0);  // rank 0 listed everywhere
  if (world_size() > 1) EXPECT_ERROR_CONTAINS(DeviceMesh::from_ranks({world_size()}, repeated), "lists rank 0 more than once");
  EXPECT_ERROR_CONTAINS(DeviceMesh::create({world_size()}, {}, MeshOptions{"tpu"}), "device type 'tpu' is not supported");
}
