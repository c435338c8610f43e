// fully_shard from C++ (shardtensor/parallel.h, namespace fsdp) against one process: a Sequential
// whose entries are fully sharded in place and the root called through its FSDPModule; FSDP over
// all ranks, FSDP x TP and HSDP on 2x2; widths the data-parallel ranks divide, do not divide and
// leave empty pieces; with and without reshard_after_forward; parameters after Adam steps, the
// bytes of the forward's gathers, two forwards before one backward, and bad input.
#include <torch/torch.h>

#include "dist/dist_fixture.h"
#include "shardtensor/dispatch.h"
#include "shardtensor/parallel.h"

using namespace shardtensor;
using namespace shardtensor::testing;
namespace fsdp = shardtensor::fsdp;
namespace par = shardtensor::parallel;

namespace {

constexpr int kSteps = 4;

torch::nn::Sequential make_mlp(int64_t hidden) {
  torch::manual_seed(hidden);
  torch::nn::Sequential net(torch::nn::Linear(8, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, 6), torch::nn::ReLU(),
                            torch::nn::Linear(6, 5));
  net->to(torch::kDouble);
  return net;
}

// The global batch of each step, split into one piece per data-parallel rank (unevenly).
std::vector<std::vector<at::Tensor>> batches(int64_t dp) {
  std::vector<std::vector<at::Tensor>> out;
  for (int step = 0; step < kSteps; ++step)
    out.push_back(draw_double({dp * 3 + 1, 8}, 100 + static_cast<uint64_t>(step)).tensor_split(dp));
  return out;
}

// The oracle: each step's loss is the mean of the data-parallel ranks' losses, then Adam.
void train_one_process(torch::nn::Sequential& net, const std::vector<std::vector<at::Tensor>>& data) {
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(0.02));
  for (const auto& chunks : data) {
    opt.zero_grad();
    at::Tensor loss = at::zeros({}, torch::kDouble);
    for (const at::Tensor& x : chunks) loss = loss + net->forward(x).pow(2).mean();
    (loss / static_cast<double>(chunks.size())).backward();
    opt.step();
  }
}

void train(fsdp::FSDPModule& model, const std::vector<std::vector<at::Tensor>>& data, int64_t dp_rank) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.02));
  for (const auto& chunks : data) {
    opt.zero_grad();
    model->forward(chunks[static_cast<size_t>(dp_rank)]).pow(2).mean().backward();
    opt.step();
  }
}

// Every parameter, gathered, equals one process's; names are the root's "module." + one process's.
void expect_parameters_match(fsdp::FSDPModule& model, torch::nn::Sequential& single, const std::string& where) {
  const auto mine = model->named_parameters();
  ASSERT_EQ(mine.size(), single->named_parameters().size()) << where;
  for (const auto& reference : single->named_parameters()) {
    const at::Tensor* p = mine.find("module." + reference.key());
    ASSERT_NE(p, nullptr) << where << ": no parameter module." << reference.key();
    ASSERT_TRUE(is_shard_tensor(*p)) << where << ": " << reference.key() << " is not sharded between steps";
    EXPECT_TRUE(torch::allclose(full_tensor(*p), reference.value(), 1e-9, 1e-11)) << where << ": " << reference.key();
  }
}

fsdp::FSDPModule wrap(torch::nn::Sequential net, const DeviceMesh& mesh, bool reshard = true) {
  fsdp::FullyShardOptions options;
  options.reshard_after_forward = reshard;
  fsdp::fully_shard(*net, mesh, "0", options);
  fsdp::fully_shard(*net, mesh, "2", options);
  return fsdp::fully_shard(net, mesh, options);  // the root takes the last Linear
}

}  // namespace

TEST(FullyShard, DataParallelMatchesOneProcess) {
  const DeviceMesh& mesh = mesh_1d();
  const int64_t n = mesh.size();
  const auto data = batches(n);
  for (int64_t hidden : {4 * n, int64_t{27}, int64_t{3}})
    for (bool reshard : {true, false}) {
      const std::string where = "hidden " + std::to_string(hidden) + ", reshard_after_forward " + std::to_string(reshard);
      torch::nn::Sequential single = make_mlp(hidden);
      fsdp::FSDPModule model = wrap(make_mlp(hidden), mesh, reshard);
      const at::Tensor w = *model->named_parameters().find("module.0.weight");
      EXPECT_EQ(spec(w).placements(), Placements{Shard(0)}) << where;
      train_one_process(single, data);
      train(model, data, mesh.coordinate()[0]);
      expect_parameters_match(model, single, where);
    }
}

TEST(FullyShard, GathersSendTheParameterBytesAndTwoForwardsAccumulate) {
  const DeviceMesh& mesh = mesh_1d();
  const int64_t n = mesh.size();
  fsdp::FSDPModule model = wrap(make_mlp(27), mesh);
  torch::nn::Sequential single = make_mlp(27);
  const auto data = batches(n)[0];
  const at::Tensor x = data[static_cast<size_t>(mesh.coordinate()[0])];
  int64_t sent = 0;
  at::Tensor loss;
  {
    CommDebugMode comms;
    loss = model->forward(x).pow(2).mean();
    sent = comms.bytes();
  }
  // Each all-gather sends every piece to the n - 1 other ranks once: nothing for padding
  // (27 rows over 4 ranks are 7, 7, 7, 6).
  at::Tensor all = at::tensor({static_cast<double>(sent)}, torch::kDouble);
  mesh.comm(0).all_reduce(all, ReduceOp::Sum);
  int64_t parameter_bytes = 0;
  for (const at::Tensor& p : single->parameters()) parameter_bytes += p.numel() * p.element_size();
  EXPECT_EQ(all.item<double>(), static_cast<double>(parameter_bytes * (n - 1)));
  // A second forward before the backward (reshard_after_forward empties each forward's pieces):
  // the gradients are both forwards' sum, as on one process.
  loss = loss + model->forward(x.flip(0)).pow(2).mean();
  loss.backward();
  at::Tensor reference = at::zeros({}, torch::kDouble);
  for (const at::Tensor& chunk : data) reference = reference + single->forward(chunk).pow(2).mean() + single->forward(chunk.flip(0)).pow(2).mean();
  (reference / static_cast<double>(n)).backward();
  for (const auto& named : single->named_parameters()) {
    const at::Tensor& p = *model->named_parameters().find("module." + named.key());
    ASSERT_TRUE(p.grad().defined()) << named.key();
    EXPECT_TRUE(torch::allclose(full_tensor(p.grad()), named.value().grad(), 1e-9, 1e-11)) << named.key();
  }
}

TEST(FullyShard, WithTensorParallelismAndHsdpMatchesOneProcess) {
  if (world_size() != 4) GTEST_SKIP() << "FSDP x TP and HSDP run on a 2x2 mesh: 4 ranks";
  const DeviceMesh mesh = DeviceMesh::create({2, 2}, {"dp", "tp"});
  const auto data = batches(2);
  for (int64_t hidden : {int64_t{8}, int64_t{27}, int64_t{3}}) {
    torch::nn::Sequential single = make_mlp(hidden), net = make_mlp(hidden);
    par::parallelize_module(*net, mesh.submesh("tp"), {{"0", par::ColwiseParallel()}, {"2", par::RowwiseParallel()}});
    fsdp::FSDPModule model = wrap(net, mesh.submesh("dp"));
    const at::Tensor w = *model->named_parameters().find("module.0.weight");
    // "dp" nested inside "tp": the tp piece of the rows, split again over dp.
    EXPECT_EQ(spec(w).placements(), (Placements{Shard(0), Shard(0)}));
    EXPECT_EQ(spec(w).mesh().dim_names(), (std::vector<std::string>{"tp", "dp"}));
    train_one_process(single, data);
    train(model, data, mesh.coordinate()[0]);
    expect_parameters_match(model, single, "FSDP x TP, hidden " + std::to_string(hidden));
  }
  // HSDP: replicated over "replicate", sharded over "shard"; each of the 4 ranks its own batch.
  const DeviceMesh hsdp = DeviceMesh::create({2, 2}, {"replicate", "shard"});
  torch::nn::Sequential single = make_mlp(27);
  fsdp::FSDPModule model = wrap(make_mlp(27), hsdp);
  EXPECT_EQ(spec(*model->named_parameters().find("module.0.weight")).placements(), (Placements{Replicate(), Shard(0)}));
  const auto four = batches(4);
  train_one_process(single, four);
  train(model, four, hsdp.rank());
  expect_parameters_match(model, single, "HSDP");
}

TEST(FullyShard, MixedPrecisionGathersAndComputesInParamDtype) {
  const DeviceMesh& mesh = mesh_1d();
  fsdp::FullyShardOptions options;
  options.mp_policy.param_dtype = torch::kFloat;
  options.mp_policy.reduce_dtype = torch::kDouble;
  torch::nn::Sequential net = make_mlp(27), single = make_mlp(27);
  fsdp::fully_shard(*net, mesh, "0", options);
  fsdp::FSDPModule model = fsdp::fully_shard(net, mesh, options);
  const auto data = batches(mesh.size())[0];
  const at::Tensor y = model->forward(data[static_cast<size_t>(mesh.coordinate()[0])]);
  EXPECT_EQ(y.scalar_type(), torch::kFloat);
  y.pow(2).mean().backward();
  // One process in float32, the gradients compared in float64.
  single->to(torch::kFloat);
  at::Tensor loss = at::zeros({}, torch::kFloat);
  for (const at::Tensor& chunk : data) loss = loss + single->forward(chunk.to(torch::kFloat)).pow(2).mean();
  (loss / static_cast<double>(mesh.size())).backward();
  for (const auto& named : single->named_parameters()) {
    const at::Tensor& p = *model->named_parameters().find("module." + named.key());
    EXPECT_EQ(p.scalar_type(), torch::kDouble) << named.key() << ": the sharded parameter keeps its dtype";
    EXPECT_TRUE(torch::allclose(full_tensor(p.grad()), named.value().grad().to(torch::kDouble), 1e-4, 1e-6)) << named.key();
  }
  // Without reduce_dtype the gradients are reduced in param_dtype (FSDP2's default): the
  // backward's reduce-scatters (no gathers: reshard_after_forward off) send half the bytes.
  std::vector<double> sent;
  for (bool reduce_in_double : {true, false}) {
    fsdp::FullyShardOptions o;
    o.reshard_after_forward = false;
    o.mp_policy.param_dtype = torch::kFloat;
    if (reduce_in_double) o.mp_policy.reduce_dtype = torch::kDouble;
    fsdp::FSDPModule m = fsdp::fully_shard(make_mlp(27), mesh, o);
    const at::Tensor out = m->forward(data[static_cast<size_t>(mesh.coordinate()[0])]);
    CommDebugMode comms;
    out.pow(2).mean().backward();
    sent.push_back(static_cast<double>(comms.bytes()));
  }
  at::Tensor all = at::tensor(sent, torch::kDouble);
  mesh.comm(0).all_reduce(all, ReduceOp::Sum);
  int64_t elements = 0;
  for (const at::Tensor& p : single->parameters()) elements += p.numel();
  const double n = static_cast<double>(mesh.size() - 1);
  EXPECT_EQ(all[0].item<double>(), n * static_cast<double>(elements) * 8);
  EXPECT_EQ(all[1].item<double>(), n * static_cast<double>(elements) * 4);
}

namespace {
struct ScaleImpl : torch::nn::Module {
  ScaleImpl() : scale(register_parameter("scale", torch::ones({4}))) {}
  at::Tensor forward(const at::Tensor& x) { return x * scale; }
  at::Tensor scale;
};
TORCH_MODULE(Scale);
}  // namespace

TEST(FullyShard, BadInputRaisesOnEveryRankNamingWhatIsAllowed) {
  const DeviceMesh& mesh = mesh_1d();
  // A parameter read through a member of the user's own: shardtensor could not swap it.
  EXPECT_ERROR_CONTAINS(fsdp::fully_shard(Scale(), mesh), "parameter 'scale'", "Linear", "cannot swap");
  // A path that names no Sequential entry.
  torch::nn::Sequential net = make_mlp(4);
  EXPECT_ERROR_CONTAINS(fsdp::fully_shard(*net, mesh, "7"), "names no module", "'7'");
  // A tensor-parallel parameter on a mesh the data-parallel mesh is not a dim of.
  if (world_size() == 4) {
    const DeviceMesh a = DeviceMesh::create({2, 2}, {"dp", "tp"});
    const DeviceMesh b = DeviceMesh::create({2, 2}, {"dp", "tp"});
    torch::nn::Sequential tp = make_mlp(8);
    par::parallelize_module(*tp, a.submesh("tp"), {{"0", par::ColwiseParallel()}});
    EXPECT_ERROR_CONTAINS(fsdp::fully_shard(tp, b.submesh("dp")), "is not a dim of the same mesh", "submesh(\"dp\")");
    torch::nn::Sequential same = make_mlp(8);
    par::parallelize_module(*same, a.submesh("tp"), {{"0", par::ColwiseParallel()}});
    EXPECT_ERROR_CONTAINS(fsdp::fully_shard(same, a.submesh("tp")), "already laid out over the data-parallel mesh dims", "[tp]");
  }
}
