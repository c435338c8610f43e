// DTensor's module API from C++ (shardtensor/parallel.h): torch::nn modules parallelized by a
// plan, a Sequential whose entries' calls the plan wraps, distribute_module with its three
// functions; values and gradients against the same module on one process, on widths,
// vocabularies and sequences the mesh does not divide (empty pieces at 4 ranks).
#include <torch/torch.h>

#include "dist/dist_fixture.h"
#include "shardtensor/parallel.h"

using namespace shardtensor;
using namespace shardtensor::testing;
namespace par = shardtensor::parallel;

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t width, int64_t hidden)
      : up(register_module("up", torch::nn::Linear(width, hidden))), down(register_module("down", torch::nn::Linear(hidden, width))) {}
  at::Tensor forward(const at::Tensor& x) { return down(torch::gelu(up(x))); }
  torch::nn::Linear up, down;
};
TORCH_MODULE(Mlp);

template <typename Build>
auto seeded(Build build) {
  torch::manual_seed(3);
  auto module = build();
  module->to(torch::kDouble);
  return module;
}

at::Tensor whole(const at::Tensor& t) { return is_shard_tensor(t) ? full_tensor(t) : t; }

// Every parameter of `sharded` equals one process's of the same name, in value and gradient.
void expect_parameters_match(torch::nn::Module& sharded, torch::nn::Module& single, const std::string& where) {
  const auto mine = sharded.named_parameters();
  for (const auto& reference : single.named_parameters()) {
    const at::Tensor* p = mine.find(reference.key());
    ASSERT_NE(p, nullptr) << where << ": no parameter " << reference.key();
    EXPECT_TRUE(torch::allclose(whole(*p), reference.value(), 1e-12, 1e-12)) << where << ": " << reference.key();
    ASSERT_TRUE(p->grad().defined()) << where << ": " << reference.key() << " has no gradient";
    EXPECT_TRUE(torch::allclose(whole(p->grad()), reference.value().grad(), 1e-10, 1e-12))
        << where << ": gradient of " << reference.key();
  }
}

// The 1-D meshes a plan runs on at this world size: all ranks, and the last dim of 2x2.
std::vector<DeviceMesh> tensor_parallel_meshes() {
  std::vector<DeviceMesh> out;
  for (const DeviceMesh& mesh : test_meshes())
    if (mesh.ndim() == 1) out.push_back(mesh);
    else if (mesh.shape() == std::vector<int64_t>{2, 2}) out.push_back(mesh.submesh(1));
  return out;
}

}  // namespace

TEST(ModuleApi, ColwiseRowwisePlanOnAModuleMatchesOneProcess) {
  for (const DeviceMesh& mesh : tensor_parallel_meshes())
    for (int64_t hidden : {30, 3, 8}) {
      const std::string where = mesh.to_string() + ", hidden " + std::to_string(hidden);
      Mlp single = seeded([&] { return Mlp(8, hidden); }), sharded = seeded([&] { return Mlp(8, hidden); });
      par::parallelize_module(*sharded, mesh, {{"up", par::ColwiseParallel()}, {"down", par::RowwiseParallel()}});
      EXPECT_TRUE(is_shard_tensor(sharded->up->weight)) << where;
      EXPECT_EQ(spec(sharded->up->weight).placements(), Placements{Shard(0)}) << where;
      EXPECT_EQ(spec(sharded->down->weight).placements(), Placements{Shard(1)}) << where;

      torch::manual_seed(5);
      const at::Tensor x = torch::randn({2, 5, 8}, torch::kDouble);
      const at::Tensor x_mine = x.clone().requires_grad_(), x_single = x.clone().requires_grad_();
      const at::Tensor y = sharded(x_mine), reference = single(x_single);
      EXPECT_TRUE(torch::allclose(whole(y), reference, 1e-12, 1e-12)) << where;
      (y * y).sum().backward();
      (reference * reference).sum().backward();
      expect_parameters_match(*sharded, *single, where);
      // A plain input keeps a plain gradient, one process's.
      ASSERT_FALSE(is_shard_tensor(x_mine.grad())) << where;
      EXPECT_TRUE(torch::allclose(x_mine.grad(), x_single.grad(), 1e-10, 1e-12)) << where;
    }
}

TEST(ModuleApi, SequentialPlanWrapsEachEntrysCallWithItsStyle) {
  // Megatron's sequence parallelism: the norm on a split sequence (13 positions), the Colwise
  // Linear gathering it, the Rowwise one scattering its sum back over the sequence.
  for (const DeviceMesh& mesh : tensor_parallel_meshes()) {
    auto build = [] {
      return torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})), torch::nn::Linear(8, 30),
                                   torch::nn::GELU(), torch::nn::Linear(30, 8));
    };
    torch::nn::Sequential single = seeded(build), sharded = seeded(build);
    par::parallelize_module(*sharded, mesh,
                            {{"0", par::SequenceParallel(1)},
                             {"1", par::ColwiseParallel().input_layouts(Shard(1))},
                             {"3", par::RowwiseParallel().output_layouts(Shard(1))}});
    // The Sequential keeps its children, so names (and state dicts) are unchanged.
    std::vector<std::string> names, reference_names;
    for (const auto& p : sharded->named_parameters()) names.push_back(p.key());
    for (const auto& p : single->named_parameters()) reference_names.push_back(p.key());
    EXPECT_EQ(names, reference_names);

    torch::manual_seed(7);
    const at::Tensor x = torch::randn({2, 13, 8}, torch::kDouble);
    const std::vector<int64_t> lengths = chunk_sizes(13, mesh.size());
    const int64_t mine = mesh.coordinate()[0];
    const int64_t start = std::accumulate(lengths.begin(), lengths.begin() + mine, int64_t{0});
    const at::Tensor piece = x.narrow(1, start, lengths[mine]).clone();  // this rank's part of the sequence
    const at::Tensor y = sharded->forward(piece), reference = single->forward(x);
    ASSERT_FALSE(is_shard_tensor(y)) << "use_local_output gives the local piece";
    EXPECT_TRUE(torch::allclose(y, reference.narrow(1, start, lengths[mine]), 1e-12, 1e-12)) << mesh.to_string();
    // Each rank's loss is its piece's: the sum over ranks is one process's.
    (y * y).sum().backward();
    (reference * reference).sum().backward();
    expect_parameters_match(*sharded, *single, "Sequential on " + mesh.to_string());
  }
}

TEST(ModuleApi, EmbeddingRowwiseAndColwiseOnAVocabularyTheMeshDoesNotDivide) {
  for (const DeviceMesh& mesh : tensor_parallel_meshes()) {
    const at::Tensor ids = torch::tensor({{0, 9, 3}, {7, 7, 1}}, torch::kLong);
    for (bool rowwise : {true, false}) {
      auto build = [] { return torch::nn::Embedding(10, 6); };
      torch::nn::Embedding single = seeded(build);
      // As torchtitan writes it: the ids are whole on every rank (RowwiseParallel's default input
      // is a Shard(-1) piece, as DTensor's).
      DistributedModule sharded = rowwise ? par::parallelize_module(seeded(build), mesh, par::RowwiseParallel().input_layouts(Replicate()))
                                          : par::parallelize_module(seeded(build), mesh, par::ColwiseParallel().use_local_output(false));
      const at::Tensor y = sharded(ids), reference = single(ids);
      EXPECT_TRUE(torch::allclose(whole(y), reference, 1e-12, 1e-12)) << mesh.to_string() << (rowwise ? " rowwise" : " colwise");
      const at::Tensor target = reference.detach().cos();
      (whole(y) * target).sum().backward();
      (reference * target).sum().backward();
      const at::Tensor& weight = sharded->named_parameters()["module.weight"];
      EXPECT_TRUE(torch::allclose(whole(weight.grad()), single->weight.grad(), 1e-12, 1e-12)) << mesh.to_string();
    }
  }
}

TEST(ModuleApi, DistributeModuleRunsPartitionInputAndOutputFunctions) {
  const DeviceMesh& mesh = test_meshes()[0];
  auto build = [] { return torch::nn::Linear(4, 7); };
  torch::nn::Linear single = seeded(build), local = seeded(build);
  // A bias that differs between ranks: the parameters partition_fn leaves plain get rank 0's values.
  {
    at::NoGradGuard no_grad;
    local->bias.add_(static_cast<double>(mesh.rank()));
  }
  std::vector<std::string> partitioned;
  DistributedModule sharded = distribute_module(
      local, mesh,
      [&](const std::string& name, torch::nn::Module& m, const DeviceMesh& dm) {
        partitioned.push_back(name);
        auto* linear = dynamic_cast<torch::nn::LinearImpl*>(&m);
        if (linear != nullptr) replace_parameter(m, "weight", distribute_tensor(linear->weight.detach(), dm, {Shard(0)}));
      },
      [](torch::nn::Module&, const at::Tensor& x, const DeviceMesh& dm) { return from_local(x, dm, {Replicate()}); },
      [](torch::nn::Module&, const at::Tensor& y, const DeviceMesh&) { return full_tensor(y); });
  EXPECT_EQ(partitioned, std::vector<std::string>{""});
  EXPECT_TRUE(is_shard_tensor(local->weight));
  EXPECT_FALSE(is_shard_tensor(local->bias));
  EXPECT_TRUE(torch::equal(local->bias, single->bias));
  EXPECT_NE(sharded->named_parameters().find("module.weight"), nullptr);

  const at::Tensor x = torch::arange(12, torch::kDouble).view({3, 4}) / 10;
  const at::Tensor y = sharded(x), reference = single(x);
  ASSERT_FALSE(is_shard_tensor(y)) << "output_fn returned the whole tensor";
  EXPECT_TRUE(torch::allclose(y, reference, 1e-12, 1e-12));
  y.sum().backward();
  reference.sum().backward();
  EXPECT_TRUE(torch::allclose(whole(local->weight.grad()), single->weight.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(local->bias.grad(), single->bias.grad(), 1e-12, 1e-12));
}

TEST(ModuleApi, BadPlansRaiseOnEveryRankNamingWhatIsAllowed) {
  const DeviceMesh& mesh = test_meshes()[0];
  torch::nn::Conv2d conv(1, 2, 3);
  EXPECT_ERROR_CONTAINS(par::parallelize_module(conv, mesh, par::ColwiseParallel()), "ColwiseParallel supports",
                        "torch::nn::Linear", "distribute_module");
  Mlp mlp = seeded([] { return Mlp(4, 6); });
  for (const DeviceMesh& two_d : test_meshes())
    if (two_d.ndim() == 2)
      EXPECT_ERROR_CONTAINS(par::parallelize_module(*mlp, two_d, {{"up", par::ColwiseParallel()}}), "takes a 1-D DeviceMesh",
                            "submesh");
  EXPECT_ERROR_CONTAINS(replace_parameter(*mlp->up, "scale", at::ones({1})), "has no parameter 'scale'", "weight", "bias");
}
