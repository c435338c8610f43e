// End to end: ordinary libtorch training code (torch::nn::Linear, ReLU, layer norm, attention
// by matmul + softmax, MSE loss, SGD and Adam, backward()) on ShardTensor inputs and
// parameters gives, step after step, the losses of the same code on one process.
#include <torch/torch.h>

#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

// A torch::nn::Linear whose parameters become ShardTensors: the module's forward, its
// parameters() and any optimizer see the distributed tensors.
struct ShardedLinearImpl : torch::nn::LinearImpl {
  using torch::nn::LinearImpl::LinearImpl;
  void distribute(const DeviceMesh& mesh, const Placements& weight_layout, const Placements& bias_layout) {
    weight = distribute_tensor(weight.detach(), mesh, weight_layout).set_requires_grad(true);
    bias = distribute_tensor(bias.detach(), mesh, bias_layout).set_requires_grad(true);
    parameters_["weight"] = weight;
    parameters_["bias"] = bias;
  }
};
TORCH_MODULE(ShardedLinear);

ShardedLinear make_linear(int64_t in, int64_t out) {
  ShardedLinear l(torch::nn::LinearOptions(in, out));
  l->to(torch::kDouble);
  return l;
}

struct Mlp {
  ShardedLinear l1 = make_linear(6, 16), l2 = make_linear(16, 12), l3 = make_linear(12, 4);
  at::Tensor forward(const at::Tensor& x) { return l3(torch::relu(l2(torch::relu(l1(x))))); }
  std::vector<at::Tensor> parameters() {
    std::vector<at::Tensor> ps;
    for (auto* l : {&l1, &l2, &l3})
      for (const at::Tensor& p : (*l)->parameters()) ps.push_back(p);
    return ps;
  }
};

struct Block {
  int64_t d = 8;
  ShardedLinear q = make_linear(d, d), k = make_linear(d, d), v = make_linear(d, d), up = make_linear(d, 16), down = make_linear(16, d);
  at::Tensor norm_weight = torch::ones({d}, torch::kDouble).requires_grad_(), norm_bias = torch::zeros({d}, torch::kDouble).requires_grad_();
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = torch::layer_norm(x, {d}, norm_weight, norm_bias);
    const at::Tensor scores = torch::matmul(q(h), k(h).transpose(1, 2)) / std::sqrt(static_cast<double>(d));
    const at::Tensor attended = x + torch::matmul(torch::softmax(scores, -1), v(h));
    return attended + down(torch::gelu(up(torch::layer_norm(attended, {d}))));
  }
  std::vector<at::Tensor> parameters() {
    std::vector<at::Tensor> ps = {norm_weight, norm_bias};
    for (auto* l : {&q, &k, &v, &up, &down})
      for (const at::Tensor& p : (*l)->parameters()) ps.push_back(p);
    return ps;
  }
};

// The rows of a batch of `n` split over `mesh_dim_size` ranks, unevenly when it can be.
std::vector<int64_t> uneven_rows(int64_t n, int64_t parts) {
  if (parts == 4 && n == 10) return {1, 4, 2, 3};
  if (parts == 3 && n == 10) return {5, 0, 5};
  return chunk_sizes(n, parts);
}

template <typename Model, typename Optimizer>
std::vector<double> train(Model& model, Optimizer& optimizer, const at::Tensor& x, const at::Tensor& y, int steps) {
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    at::Tensor loss = torch::mse_loss(model.forward(x), y);
    loss.backward();
    optimizer.step();
    losses.push_back((is_shard_tensor(loss) ? full_tensor(loss) : loss).item<double>());
  }
  return losses;
}

void expect_same_losses(const std::vector<double>& sharded, const std::vector<double>& reference, const std::string& what) {
  ASSERT_EQ(sharded.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i)
    EXPECT_NEAR(sharded[i], reference[i], 1e-5 * std::abs(reference[i]) + 1e-12) << what << ", step " << i;
}

std::vector<DeviceMesh> training_meshes() {
  std::vector<DeviceMesh> meshes;
  for (const DeviceMesh& m : test_meshes())
    if (m.ndim() == 1 || (m.ndim() == 2 && m.size(0) == 2 && m.size(1) == 2)) meshes.push_back(m);
  return meshes;
}

}  // namespace

TEST(Training, MlpDataAndTensorParallelMatchesOneProcess) {
  for (const DeviceMesh& mesh : training_meshes()) {
    const int64_t batch_dim = 0, tp_dim = mesh.ndim() - 1;  // on 1-D meshes both share the one mesh dim
    for (const bool tensor_parallel : {false, true}) {
      SCOPED_TRACE(mesh.to_string() + (tensor_parallel ? " tensor-parallel" : " data-parallel"));
      torch::manual_seed(7);
      Mlp reference, sharded;
      for (size_t i = 0; i < reference.parameters().size(); ++i)
        sharded.parameters()[i].detach().copy_(reference.parameters()[i].detach());
      const at::Tensor x = torch::randn({10, 6}, torch::kDouble), y = torch::randn({10, 4}, torch::kDouble);

      Placements rep(mesh.ndim(), Replicate());
      Placements x_layout = rep, col = rep, row = rep, col_bias = rep;
      if (!tensor_parallel || mesh.ndim() == 2) x_layout[batch_dim] = Shard(0);
      if (tensor_parallel) col[tp_dim] = Shard(0), row[tp_dim] = Shard(1), col_bias[tp_dim] = Shard(0);
      sharded.l1->distribute(mesh, col, col_bias);
      sharded.l2->distribute(mesh, row, rep);
      sharded.l3->distribute(mesh, rep, rep);
      ShardSizes rows;
      if (x_layout[0].is_shard()) rows = {{0, uneven_rows(10, mesh.size(0))}};
      const at::Tensor sx = distribute_tensor(x, mesh, x_layout, rows), sy = distribute_tensor(y, mesh, x_layout, rows);

      torch::optim::SGD ref_opt(reference.parameters(), 0.05), opt(sharded.parameters(), 0.05);
      expect_same_losses(train(sharded, opt, sx, sy, 20), train(reference, ref_opt, x, y, 20), "MLP SGD");
      for (size_t i = 0; i < reference.parameters().size(); ++i)
        EXPECT_TRUE(torch::allclose(full_tensor(sharded.parameters()[i]), reference.parameters()[i], 1e-6, 1e-9)) << "parameter " << i;
    }
  }
}

TEST(Training, TransformerBlockSequenceShardedWithAdamMatchesOneProcess) {
  for (const DeviceMesh& mesh : training_meshes()) {
    if (mesh.ndim() != 1) continue;
    SCOPED_TRACE(mesh.to_string());
    torch::manual_seed(11);
    Block reference, sharded;
    for (size_t i = 0; i < reference.parameters().size(); ++i)
      sharded.parameters()[i].detach().copy_(reference.parameters()[i].detach());
    const Placements rep = {Replicate()};
    for (auto* l : {&sharded.q, &sharded.k, &sharded.v, &sharded.up, &sharded.down}) (*l)->distribute(mesh, rep, rep);
    sharded.norm_weight = distribute_tensor(sharded.norm_weight.detach(), mesh, rep).set_requires_grad(true);
    sharded.norm_bias = distribute_tensor(sharded.norm_bias.detach(), mesh, rep).set_requires_grad(true);
    const at::Tensor x = torch::randn({2, 10, 8}, torch::kDouble), y = torch::randn({2, 10, 8}, torch::kDouble);
    const ShardSizes seq = {{1, uneven_rows(10, mesh.size(0))}};
    const at::Tensor sx = distribute_tensor(x, mesh, {Shard(1)}, seq), sy = distribute_tensor(y, mesh, {Shard(1)}, seq);
    torch::optim::Adam ref_opt(reference.parameters(), torch::optim::AdamOptions(0.01)),
        opt(sharded.parameters(), torch::optim::AdamOptions(0.01));
    expect_same_losses(train(sharded, opt, sx, sy, 20), train(reference, ref_opt, x, y, 20), "transformer block Adam");
  }
}
