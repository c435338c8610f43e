// Sharding-invariant randomness: with the same seed, dropout masks and in-place random fills
// are the same whatever the layout, and they behave like the distributions they claim.
#include <ATen/ATen.h>

#include <functional>

#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

// The same global tensor under a few layouts of every test mesh.
std::vector<at::Tensor> layouts_of(const at::Tensor& global) {
  std::vector<at::Tensor> out;
  for (const DeviceMesh& mesh : test_meshes()) {
    out.push_back(distribute_tensor(global, mesh, Placements(mesh.ndim(), Replicate())));
    out.push_back(distribute_tensor(global, mesh, Placements(mesh.ndim(), Shard(0))));
    Placements cols(mesh.ndim(), Replicate());
    cols.back() = Shard(1);
    std::vector<int64_t> sizes(mesh.size(mesh.ndim() - 1), 0);
    sizes.back() = global.size(1);  // everything on the last rank: empty pieces elsewhere
    out.push_back(distribute_tensor(global, mesh, cols, ShardSizes{{1, sizes}}));
  }
  return out;
}

}  // namespace

TEST(Random, DropoutMaskIsTheSameOnEveryLayout) {
  at::manual_seed(3);
  const at::Tensor global = at::randn({37, 23}, at::kDouble);
  at::Tensor first;
  for (const at::Tensor& t : layouts_of(global)) {
    shardtensor::manual_seed(1234);
    const at::Tensor x = t.detach().requires_grad_();
    const at::Tensor out = at::dropout(x, 0.3, /*train=*/true);
    const at::Tensor whole = full_tensor(out);
    if (!first.defined()) first = whole;
    EXPECT_TRUE(at::equal(whole, first)) << spec(t);
    // Kept elements are scaled by 1 / (1 - p), the rest are zero; the gradient follows the mask.
    const at::Tensor kept = whole != 0;
    EXPECT_TRUE(at::allclose(whole.masked_select(kept), global.masked_select(kept) / 0.7));
    const double fraction = kept.to(at::kDouble).mean().item<double>();
    EXPECT_NEAR(fraction, 0.7, 0.06);
    out.sum().backward();
    EXPECT_TRUE(at::allclose(full_tensor(x.grad()), kept.to(at::kDouble) / 0.7)) << spec(t);
  }
}

TEST(Random, InPlaceFillsAreShardingInvariantAndInRange) {
  at::Tensor uniform_first, normal_first;
  for (const at::Tensor& t : layouts_of(at::zeros({41, 19}, at::kDouble))) {
    shardtensor::manual_seed(99);
    const at::Tensor u = full_tensor(at::empty_like(t).uniform_(-2.0, 3.0));
    const at::Tensor n = full_tensor(at::empty_like(t).normal_(1.0, 2.0));
    if (!uniform_first.defined()) {
      uniform_first = u;
      normal_first = n;
    }
    EXPECT_TRUE(at::equal(u, uniform_first)) << spec(t);
    EXPECT_TRUE(at::equal(n, normal_first)) << spec(t);
    EXPECT_GE(u.min().item<double>(), -2.0);
    EXPECT_LT(u.max().item<double>(), 3.0);
    EXPECT_NEAR(n.mean().item<double>(), 1.0, 0.25);
    EXPECT_NEAR(n.std().item<double>(), 2.0, 0.25);
  }
}

TEST(Random, EveryDistributionIsShardingInvariantAndBehavesLikeIt) {
  // Each fill drawn on every layout must give the same global values; the summary statistics
  // of 41 x 19 = 779 draws must match the distribution's (tolerances of about 4 standard errors).
  struct Fill {
    const char* name;
    std::function<at::Tensor(const at::Tensor&)> draw;
    std::function<void(const at::Tensor&)> check;
  };
  const std::vector<Fill> fills = {
      {"exponential_(2)", [](const at::Tensor& t) { return t.exponential_(2.0); },
       [](const at::Tensor& v) {
         EXPECT_GE(v.min().item<double>(), 0.0);
         EXPECT_NEAR(v.mean().item<double>(), 0.5, 0.08);
       }},
      {"log_normal_(0.5, 0.25)", [](const at::Tensor& t) { return t.log_normal_(0.5, 0.25); },
       [](const at::Tensor& v) {
         EXPECT_GT(v.min().item<double>(), 0.0);
         EXPECT_NEAR(v.log().mean().item<double>(), 0.5, 0.04);
         EXPECT_NEAR(v.log().std().item<double>(), 0.25, 0.04);
       }},
      {"cauchy_(1, 2)", [](const at::Tensor& t) { return t.cauchy_(1.0, 2.0); },
       [](const at::Tensor& v) {
         EXPECT_NEAR(v.median().item<double>(), 1.0, 0.4);
         const double inside = ((v - 1).abs() < 2).to(at::kDouble).mean().item<double>();  // half within one scale
         EXPECT_NEAR(inside, 0.5, 0.08);
       }},
      {"geometric_(0.25)", [](const at::Tensor& t) { return t.geometric_(0.25); },
       [](const at::Tensor& v) {
         EXPECT_GE(v.min().item<double>(), 1.0);
         EXPECT_TRUE(at::equal(v, v.round()));
         EXPECT_NEAR(v.mean().item<double>(), 4.0, 0.5);
       }},
      {"random_(-3, 5)", [](const at::Tensor& t) { return t.random_(-3, 5); },
       [](const at::Tensor& v) {
         EXPECT_EQ(v.min().item<double>(), -3.0);
         EXPECT_EQ(v.max().item<double>(), 4.0);
         EXPECT_TRUE(at::equal(v, v.round()));
         EXPECT_NEAR(v.mean().item<double>(), 0.5, 0.35);
       }},
      {"random_(7)", [](const at::Tensor& t) { return t.random_(7); },
       [](const at::Tensor& v) {
         EXPECT_EQ(v.min().item<double>(), 0.0);
         EXPECT_EQ(v.max().item<double>(), 6.0);
       }},
      {"bernoulli(p = 0.3 everywhere)", [](const at::Tensor& t) { return at::bernoulli(at::full_like(t, 0.3)); },
       [](const at::Tensor& v) {
         EXPECT_TRUE(at::equal(v, v.round()));
         EXPECT_NEAR(v.mean().item<double>(), 0.3, 0.07);
       }},
      {"bernoulli_(p = 0.7 everywhere)", [](const at::Tensor& t) { return t.bernoulli_(at::full_like(t, 0.7)); },
       [](const at::Tensor& v) { EXPECT_NEAR(v.mean().item<double>(), 0.7, 0.07); }},
      {"bernoulli(t, 0.2)", [](const at::Tensor& t) { return at::bernoulli(t, 0.2); },
       [](const at::Tensor& v) { EXPECT_NEAR(v.mean().item<double>(), 0.2, 0.06); }},
      {"rand_like", [](const at::Tensor& t) { return at::rand_like(t); },
       [](const at::Tensor& v) { EXPECT_NEAR(v.mean().item<double>(), 0.5, 0.05); }},
      {"randn_like", [](const at::Tensor& t) { return at::randn_like(t); },
       [](const at::Tensor& v) { EXPECT_NEAR(v.std().item<double>(), 1.0, 0.1); }},
      {"randint_like(t, 3, 9)", [](const at::Tensor& t) { return at::randint_like(t, 3, 9); },
       [](const at::Tensor& v) {
         EXPECT_EQ(v.min().item<double>(), 3.0);
         EXPECT_EQ(v.max().item<double>(), 8.0);
       }},
      {"random_()", [](const at::Tensor& t) { return t.random_(); },
       [](const at::Tensor& v) {
         EXPECT_GE(v.min().item<double>(), 0.0);
         EXPECT_LE(v.max().item<double>(), 9007199254740992.0);  // double: up to 2^53
         EXPECT_GT(v.max().item<double>(), 1e15);
       }},
  };
  for (const Fill& fill : fills) {
    SCOPED_TRACE(fill.name);
    at::Tensor first;
    for (const at::Tensor& t : layouts_of(at::zeros({41, 19}, at::kDouble))) {
      shardtensor::manual_seed(7);
      const at::Tensor v = full_tensor(fill.draw(at::empty_like(t)));
      if (!first.defined()) {
        first = v;
        fill.check(v);
      }
      EXPECT_TRUE(at::equal(v, first)) << spec(t);
    }
  }
}

TEST(Random, GeneratorsAreRefusedWithAReason) {
  const DeviceMesh& mesh = test_meshes().front();
  const at::Tensor t = distribute_tensor(at::zeros({4, 4}), mesh, Placements(mesh.ndim(), Shard(0)));
  at::Generator gen = at::detail::createCPUGenerator(5);
  EXPECT_ERROR_CONTAINS(at::empty_like(t).uniform_(0, 1, gen), "aten::uniform_", "Generator", "manual_seed");
}

TEST(Random, MultinomialIsShardingInvariantAndSamplesItsDistribution) {
  // 40 rows over 5 categories with weights 0, 1, 2, 3, 4 (the first never drawn).
  const at::Tensor weights = at::arange(5, at::kDouble).repeat({40, 1});
  for (bool replacement : {true, false}) {
    SCOPED_TRACE(replacement ? "with replacement" : "without replacement");
    const int64_t n = replacement ? 50 : 4;
    at::Tensor first;
    for (const at::Tensor& t : layouts_of(weights)) {
      shardtensor::manual_seed(11);
      const at::Tensor samples = full_tensor(at::multinomial(t, n, replacement));
      ASSERT_EQ(samples.sizes(), at::IntArrayRef({40, n}));
      if (!first.defined()) {
        first = samples;
        EXPECT_EQ(samples.min().item<int64_t>(), 1) << "category 0 has no weight";
        if (replacement) {  // category k has probability k / 10
          for (int64_t k = 1; k < 5; ++k)
            EXPECT_NEAR((samples == k).to(at::kDouble).mean().item<double>(), k / 10.0, 0.03) << "category " << k;
        } else {  // four distinct categories out of the four with weight: each row is a permutation
          EXPECT_TRUE(at::equal(std::get<0>(samples.sort(1)), at::arange(1, 5, at::kLong).repeat({40, 1})));
          // The first pick is category k with probability k / 10.
          EXPECT_NEAR((samples.select(1, 0) == 4).to(at::kDouble).mean().item<double>(), 0.4, 0.25);
        }
      } else {
        EXPECT_TRUE(at::equal(samples, first)) << "the samples depend on the layout";
      }
    }
  }
}

TEST(Random, BadProbabilitiesRaiseOnEveryRankWhereverTheyAre) {
  const DeviceMesh& mesh = test_meshes().front();
  // One negative probability, in the last row: only the rank holding it can see it.
  at::Tensor p = at::full({2 * mesh.size(0), 3}, 0.5, at::kDouble);
  p[p.size(0) - 1][2] = -0.5;
  const at::Tensor sharded = distribute_tensor(p, mesh, {Shard(0)});
  EXPECT_ERROR_CONTAINS(at::multinomial(sharded, 2, true), "invalid multinomial distribution");
  EXPECT_ERROR_CONTAINS(at::bernoulli(sharded), "expects all elements of p to be in [0, 1]");
  // The mesh is still in step: a good draw works afterwards.
  EXPECT_EQ(full_tensor(at::bernoulli(distribute_tensor(p.clamp_min(0), mesh, {Shard(0)}))).size(0), p.size(0));
}
