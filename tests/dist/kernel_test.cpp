// The dispatch kernel as the foundation leaves it: every operator on a ShardTensor reaches it;
// operators without a rule raise an error naming them (never run on the storage-less wrapper);
// plain tensors and mixed meshes are refused.
#include <ATen/ATen.h>

#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {
at::Tensor replicated(const DeviceMesh& mesh, std::vector<int64_t> shape) {
  return from_local(iota(shape), mesh, Placements(mesh.ndim(), Replicate()));
}
}  // namespace

TEST(Kernel, OperatorsWithoutARuleRaiseNamingTheOperator) {
  at::Tensor t = replicated(test_meshes().front(), {3, 4});
  EXPECT_ERROR_CONTAINS(t.add(t), "aten::add.Tensor: no sharding rule");
  EXPECT_ERROR_CONTAINS(t.sum(), "aten::sum", "no sharding rule");
  EXPECT_ERROR_CONTAINS(t.relu(), "aten::relu", "no sharding rule");
  EXPECT_ERROR_CONTAINS(at::mm(t, t.t()), "no sharding rule");
  EXPECT_ERROR_CONTAINS(t.mul_(2), "aten::mul_.Scalar", "no sharding rule");
  EXPECT_ERROR_CONTAINS(t.clone(), "aten::clone", "no sharding rule");
}

TEST(Kernel, PlainTensorNextToShardTensorsIsRefused) {
  at::Tensor t = replicated(test_meshes().front(), {3, 4});
  EXPECT_ERROR_CONTAINS(t.add(at::ones({3, 4})), "aten::add.Tensor", "plain 2-d tensor", "from_local()");
}

TEST(Kernel, InputsOnDifferentMeshesAreRefused) {
  if (test_meshes().size() < 2) GTEST_SKIP() << "needs two meshes";
  at::Tensor a = replicated(test_meshes()[0], {2, 2});
  at::Tensor b = replicated(test_meshes()[1], {2, 2});
  EXPECT_ERROR_CONTAINS(a.add(b), "inputs are on different meshes", test_meshes()[0].to_string().c_str(),
                        test_meshes()[1].to_string().c_str());
}
