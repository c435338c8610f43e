// The dispatch kernel's contract beyond single operators: the fallback (warns once, correct,
// an error in strict mode), plain tensors and mixed meshes, misaligned uneven operands,
// in-place ops, pinned placements with CommDebugMode counts, custom rules and local_map.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "dispatch/direct_kernel.h"
#include "dispatch/kernel.h"
#include "dispatch/shard_tensor_impl.h"
#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

at::Tensor replicated(const DeviceMesh& mesh, std::vector<int64_t> shape) {
  return from_local(iota(shape), mesh, Placements(mesh.ndim(), Replicate()));
}

// Every rank draws the same global tensors: the oracle must be the same everywhere.
at::Tensor same_randn(std::vector<int64_t> shape) {
  static uint64_t draws = 0;
  at::manual_seed(100 + draws++);
  return at::randn(shape, at::kDouble);
}

// Restores the strict flag the suite runs with.
struct StrictScope {
  explicit StrictScope(bool strict) : previous(is_strict()) { set_strict(strict); }
  ~StrictScope() { set_strict(previous); }
  bool previous;
};

at::Tensor rows(const at::Tensor& global, std::vector<int64_t> sizes) {
  return distribute_tensor(global, mesh_1d(), {Shard(0)}, ShardSizes{{0, std::move(sizes)}});
}

std::vector<int64_t> uneven(int64_t n, bool other) {
  const int64_t w = mesh_1d().size(0);
  if (w == 4 && n == 10) return other ? std::vector<int64_t>{3, 3, 2, 2} : std::vector<int64_t>{1, 4, 2, 3};
  if (w == 3 && n == 10) return other ? std::vector<int64_t>{4, 4, 2} : std::vector<int64_t>{1, 6, 3};
  if (w == 2 && n == 10) return other ? std::vector<int64_t>{5, 5} : std::vector<int64_t>{2, 8};
  return chunk_sizes(n, w);
}

// The call run by the boxed kernel itself, as every operator without a direct kernel is.
at::Tensor through_boxed_kernel(const char* name, const char* overload, std::vector<c10::IValue> args) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  torch::jit::Stack stack(args.begin(), args.end());
  shard_tensor_kernel(op, &stack);
  return stack.back().toTensor();
}

}  // namespace

TEST(Kernel, DirectKernelsBorrowTheirArgumentsAndMatchTheBoxedKernel) {
  const at::Tensor global = same_randn({10, 4});
  const at::Tensor weight_global = same_randn({4, 3});
  for (const bool trained : {false, true}) {
    SCOPED_TRACE(trained ? "leaf that requires grad" : "no grad");
    at::Tensor x = rows(global, uneven(10, false));
    if (trained) x.requires_grad_();
    const at::Tensor w = distribute_tensor(weight_global, mesh_1d(), {Replicate()});
    const at::Tensor y = rows(global, uneven(10, false));
    const at::Tensor xs = x.unsqueeze(1);
    struct Case {
      std::function<at::Tensor()> direct;
      const char* name;
      const char* overload;
      std::vector<c10::IValue> args;
      at::Tensor oracle;
    };
    const std::vector<Case> cases = {
        {[&] { return x.t(); }, "aten::t", "", {x}, global.t()},
        {[&] { return x.sum(1); }, "aten::sum", "dim_IntList", {x, std::vector<int64_t>{1}, false, c10::IValue()}, global.sum(1)},
        {[&] { return x + y; }, "aten::add", "Tensor", {x, y, at::Scalar(1)}, global + global},
        {[&] { return x * 2.5; }, "aten::mul", "Scalar", {x, at::Scalar(2.5)}, global * 2.5},
        {[&] { return at::mm(x, w); }, "aten::mm", "", {x, w}, at::mm(global, weight_global)},
        {[&] { return x.transpose(0, 1); }, "aten::transpose", "int", {x, int64_t{0}, int64_t{1}}, global.transpose(0, 1)},
        // Views with global sizes: the rule's local kernel on the local piece.
        {[&] { return x.view({10, 2, 2}); }, "aten::view", "", {x, std::vector<int64_t>{10, 2, 2}}, global.view({10, 2, 2})},
        {[&] { return x.unsqueeze(0); }, "aten::unsqueeze", "", {x, int64_t{0}}, global.unsqueeze(0)},
        {[&] { return xs.squeeze(1); }, "aten::squeeze", "dim", {xs, int64_t{1}}, global},
        {[&] { return x.select(1, 2); }, "aten::select", "int", {x, int64_t{1}, int64_t{2}}, global.select(1, 2)},
        {[&] { return x.slice(1, 1, 3); }, "aten::slice", "Tensor", {x, int64_t{1}, int64_t{1}, int64_t{3}, int64_t{1}},
         global.slice(1, 1, 3)},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name + std::string(".") + c.overload);
      const auto references = x.use_count();
      const uint64_t direct_before = direct_calls_on_this_thread();
      at::Tensor direct = c.direct();
      EXPECT_EQ(direct_calls_on_this_thread(), direct_before + 1) << "the direct path did not run";
      at::Tensor boxed;
      {
        at::AutoDispatchBelowADInplaceOrView below_autograd;  // where the dispatcher calls the kernel
        boxed = through_boxed_kernel(c.name, c.overload, c.args);
      }
      EXPECT_EQ(shard_tensor_impl(direct)->spec(), shard_tensor_impl(boxed)->spec());
      EXPECT_EQ(direct.strides(), boxed.strides());
      EXPECT_TRUE(at::equal(to_local(direct.detach()), to_local(boxed)));
      EXPECT_TRUE(at::allclose(full_tensor(direct.detach()), c.oracle));
      direct = at::Tensor();
      EXPECT_EQ(x.use_count(), references) << "a borrowed argument lost or kept a reference";
    }
    if (trained) {  // the leaf's gradient still arrives in its own layout through the direct path
      (x.t().sum(0) * 2).sum().backward();
      EXPECT_EQ(shard_tensor_impl(x.grad())->spec().placements(), shard_tensor_impl(x)->spec().placements());
      EXPECT_TRUE(at::allclose(full_tensor(x.grad()), at::full_like(global, 2)));
    }
  }
}

TEST(Kernel, LinearThatAutogradDoesNotRecordIsOneOperatorLaidOutAsItsDecomposition) {
  // Rows 10 and weight rows 5 split unevenly at 3 and 4 ranks (5 over 4: an empty piece).
  const at::Tensor input = same_randn({10, 6}), weight = same_randn({5, 6}), bias = same_randn({5});
  const std::vector<Placement> options = {Shard(0), Shard(1), Replicate()};
  for (const DeviceMesh& mesh : test_meshes())
    for (size_t i = 0; i < options.size(); ++i)
      for (size_t j = 0; j < options.size(); ++j)
        for (const bool with_bias : {false, true}) {
          Placements pi, pw;
          for (int64_t m = 0; m < mesh.ndim(); ++m) {
            pi.push_back(options[(i + m) % options.size()]);
            pw.push_back(options[(j + 2 * m) % options.size()]);
          }
          const at::Tensor x = distribute_tensor(input, mesh, pi), w = distribute_tensor(weight, mesh, pw);
          const at::Tensor b = distribute_tensor(bias, mesh, Placements(mesh.ndim(), j == 0 ? Shard(0) : Replicate()));
          const c10::optional<at::Tensor> maybe_bias = with_bias ? c10::optional<at::Tensor>(b) : c10::nullopt;
          SCOPED_TRACE(mesh.to_string() + " input " + spec(x).to_string() + " weight " + spec(w).to_string() +
                       (with_bias ? " with bias" : " without bias"));
          at::Tensor fused;
          const uint64_t direct_before = direct_calls_on_this_thread();
          {
            at::NoGradGuard no_grad;
            fused = at::linear(x, w, maybe_bias);
          }
          // Where nothing moves, the whole call is one direct call (the decomposition makes two).
          if (pi[0] == Shard(0) && pw == Placements(mesh.ndim(), Replicate()) && mesh.ndim() == 1)
            EXPECT_EQ(direct_calls_on_this_thread(), direct_before + 1);
          const at::Tensor decomposed = with_bias ? at::addmm(b, x, w.t()) : at::mm(x, w.t());
          EXPECT_EQ(spec(fused), spec(decomposed));
          EXPECT_EQ(fused.strides(), decomposed.strides());
          EXPECT_TRUE(at::allclose(full_tensor(fused), at::linear(input, weight, with_bias ? c10::optional<at::Tensor>(bias) : c10::nullopt)));
          EXPECT_FALSE(fused.requires_grad());
        }
  // A weight that requires grad takes the decomposition, which autograd records.
  const at::Tensor x = rows(input, uneven(10, false));
  const at::Tensor w = distribute_tensor(weight, mesh_1d(), {Replicate()}).requires_grad_();
  at::linear(x, w, distribute_tensor(bias, mesh_1d(), {Replicate()})).sum().backward();
  EXPECT_TRUE(at::allclose(full_tensor(w.grad()), input.sum(0).expand({5, 6})));
}

TEST(Kernel, OperatorsWithoutARuleFallBackCorrectlyOrRaiseInStrictMode) {
  // diag_embed and addmm_ have no rule (tests/python/test_operator_coverage.py's table).
  const at::Tensor global = same_randn({10, 4});
  const at::Tensor t = rows(global, uneven(10, false));
  {
    StrictScope strict(true);
    EXPECT_ERROR_CONTAINS(at::diag_embed(t), "aten::diag_embed", "strict mode", "register_sharding_rule");
  }
  StrictScope lenient(false);
  const at::Tensor out = at::diag_embed(t);
  EXPECT_TRUE(at::allclose(full_tensor(out), at::diag_embed(global)));
  const std::vector<std::string> fell = fallback_operators();
  EXPECT_NE(std::find(fell.begin(), fell.end(), "aten::diag_embed"), fell.end());
  // In place through the fallback: the result lands in self's own layout.
  at::Tensor s = rows(global, uneven(10, false));
  const at::Tensor a = same_randn({10, 3}), b = same_randn({3, 4});
  s.addmm_(a, b);
  EXPECT_EQ(spec(s).placements(), Placements{Shard(0)});
  EXPECT_TRUE(at::allclose(full_tensor(s), at::addmm(global, a, b)));
}

TEST(Kernel, ViewOperatorsWithoutARuleNeverFallBack) {
  // A gathered copy would not alias its base: writes through it would be silently lost.
  StrictScope lenient(false);
  const at::Tensor t = rows(same_randn({10, 4}), uneven(10, false));
  EXPECT_ERROR_CONTAINS(at::_test_autograd_multiple_dispatch_view(t), "aten::_test_autograd_multiple_dispatch_view",
                        "view operator", "register_sharding_rule");
}

TEST(Kernel, BackwardFromAPartialLossSeedsItsGradientOnce) {
  // sum over the sharded rows is Partial(sum); backward() seeds it with ones, which must count
  // once, not once per rank.
  const at::Tensor global = same_randn({10, 4});
  at::Tensor x = rows(global, uneven(10, false)).requires_grad_();
  const at::Tensor loss = (x * x).sum();
  ASSERT_TRUE(spec(loss).has_partial()) << spec(loss);
  loss.backward();
  EXPECT_TRUE(at::allclose(full_tensor(x.grad()), 2 * global));
  EXPECT_NEAR(loss.item<double>(), global.square().sum().item<double>(), 1e-9);
}

TEST(Kernel, PermutingViewsReportPermutedStridesSoWeightGradientsKeepTheWeightsLayout) {
  // A linear layer's weight reaches mm through t(); autograd then lays out the weight's
  // gradient by the strides of that view, as for a plain tensor.
  const at::Tensor global = same_randn({10, 4});
  at::Tensor w = rows(global, uneven(10, false)).requires_grad_();
  EXPECT_EQ(w.t().strides(), global.t().strides());
  EXPECT_EQ(w.transpose(0, 1).t().strides(), global.strides());
  EXPECT_EQ(w.unsqueeze(0).permute({2, 0, 1}).strides(), global.unsqueeze(0).permute({2, 0, 1}).strides());
  const at::Tensor x = distribute_tensor(same_randn({3, 4}), test_meshes().front(), {Replicate()});
  at::linear(x, w).square().sum().backward();
  EXPECT_TRUE(to_local(w.grad()).is_contiguous());
  EXPECT_EQ(w.grad().strides(), global.strides());
  const at::Tensor plain = global.clone().requires_grad_();
  at::linear(full_tensor(x), plain).square().sum().backward();
  EXPECT_TRUE(at::allclose(full_tensor(w.grad()), plain.grad()));
}

TEST(Kernel, BackwardFormulasThatBuildPlainZerosWork) {
  // libtorch 1.13 fills the gradient of an unused split piece with plain at::zeros, and an
  // overwriting index_put's backward builds plain zeros too.
  const at::Tensor global = same_randn({10, 6});
  for (int64_t dim : {0, 1}) {
    SCOPED_TRACE(dim);
    at::Tensor x = rows(global, uneven(10, false)).requires_grad_();
    x.split(4, dim)[0].square().sum().backward();
    const at::Tensor plain = global.clone().requires_grad_();
    plain.split(4, dim)[0].square().sum().backward();
    EXPECT_TRUE(at::allclose(full_tensor(x.grad()), plain.grad()));
  }
  at::Tensor x = rows(global, uneven(10, false)).requires_grad_();
  const at::Tensor index = at::tensor(std::vector<int64_t>{7, 1, 4});
  const at::Tensor values_global = same_randn({3, 6});
  const DeviceMesh& mesh = spec(x).mesh();
  at::Tensor values = distribute_tensor(values_global, mesh, {Replicate()}).requires_grad_();
  const c10::List<c10::optional<at::Tensor>> indices({distribute_tensor(index, mesh, {Replicate()})});
  at::index_put(x, indices, values, /*accumulate=*/false).square().sum().backward();
  const at::Tensor plain = global.clone().requires_grad_(), plain_values = values_global.clone().requires_grad_();
  at::index_put(plain, c10::List<c10::optional<at::Tensor>>({index}), plain_values, false).square().sum().backward();
  EXPECT_TRUE(at::allclose(full_tensor(x.grad()), plain.grad()));
  EXPECT_TRUE(at::allclose(full_tensor(values.grad()), plain_values.grad()));
}

TEST(Kernel, PlainTensorsNextToShardTensors) {
  at::Tensor t = replicated(mesh_1d(), {3, 4});
  EXPECT_TRUE(is_implicit_replication());  // the default: plain tensors count as Replicate
  EXPECT_TRUE(at::allclose(full_tensor(t.add(at::ones({3, 4}))), iota({3, 4}) + 1));
  set_implicit_replication(false);
  EXPECT_ERROR_CONTAINS(t.add(at::ones({3, 4})), "aten::add.Tensor", "plain 2-d tensor", "implicit replication is off",
                        "ImplicitReplication");
  EXPECT_TRUE(at::allclose(full_tensor(t * at::scalar_tensor(2.0)), iota({3, 4}) * 2));  // 0-d: implicitly Replicate
  {
    ImplicitReplication scope;
    EXPECT_TRUE(at::allclose(full_tensor(t.add(at::ones({3, 4}))), iota({3, 4}) + 1));
  }
  set_implicit_replication(true);
}

// A plain weight beside a row-split ShardTensor: its gradient is a plain tensor, the one-process
// value, reduced once per backward although three operators used it (one through w.t()).
TEST(Kernel, PlainWeightsKeepPlainGradients) {
  const at::Tensor global = iota({7, 3}) / 10;
  at::Tensor x = distribute_tensor(global, mesh_1d(), {Shard(0)});
  at::Tensor w = (iota({3, 3}) / 5).requires_grad_();
  at::Tensor plain_w = w.detach().clone().requires_grad_();
  const auto loss = [](const at::Tensor& in, const at::Tensor& weight) {
    return (in.matmul(weight.t()).tanh().matmul(weight) * weight.sum(0)).sum();
  };
  {
    CommDebugMode comms;
    loss(x, w).backward();
    EXPECT_EQ(comms.count("all_reduce"), mesh_1d().size(0) > 1 ? 1 : 0) << comms.table();
  }
  loss(global, plain_w).backward();
  EXPECT_FALSE(is_shard_tensor(w.grad()));
  EXPECT_TRUE(at::allclose(w.grad(), plain_w.grad(), 1e-5, 1e-6));
}

TEST(Kernel, InputsOnDifferentMeshesAreRefused) {
  if (test_meshes().size() < 2) GTEST_SKIP() << "needs two meshes";
  at::Tensor a = replicated(test_meshes()[0], {2, 2});
  at::Tensor b = replicated(test_meshes()[1], {2, 2});
  EXPECT_ERROR_CONTAINS(a.add(b), "inputs are on different meshes", test_meshes()[0].to_string().c_str(),
                        test_meshes()[1].to_string().c_str());
}

// PhysicsNeMo's issue 1943: operands sharded on one dim with different shard sizes.
TEST(Kernel, MisalignedUnevenOperandsGiveTheSingleDeviceAnswer) {
  const at::Tensor gx = same_randn({10, 6}), gy = same_randn({10, 6}), gw = same_randn({6, 3});
  const at::Tensor x = rows(gx, uneven(10, false)), y = rows(gy, uneven(10, true));
  EXPECT_TRUE(at::allclose(full_tensor(x + y), gx + gy));
  EXPECT_TRUE(at::allclose(full_tensor(x * y), gx * gy));
  EXPECT_TRUE(at::allclose(full_tensor(at::where(x > y, x, y)), at::where(gx > gy, gx, gy)));
  EXPECT_TRUE(at::allclose(full_tensor(at::cat({x, y}, 1)), at::cat({gx, gy}, 1)));
  EXPECT_TRUE(at::allclose(full_tensor(at::cat({x, y}, 0)), at::cat({gx, gy}, 0)));
  const at::Tensor xt = distribute_tensor(gx.t().contiguous(), mesh_1d(), {Shard(1)}, ShardSizes{{1, uneven(10, false)}});
  EXPECT_TRUE(at::allclose(full_tensor(at::mm(xt, y)), at::mm(gx.t(), gy)));
  EXPECT_TRUE(at::allclose(full_tensor(at::mm(x, distribute_tensor(gw, mesh_1d(), {Replicate()}))), at::mm(gx, gw)));
}

TEST(Kernel, PinnedPlacementsAndTheirCommunication) {
  const DeviceMesh& mesh = mesh_1d();
  const int64_t n = mesh.size(0);
  const at::Tensor ga = same_randn({8, 6}), gb = same_randn({6, 5});
  const at::Tensor a_rows = distribute_tensor(ga, mesh, {Shard(0)}), a_cols = distribute_tensor(ga, mesh, {Shard(1)});
  const at::Tensor b_rows = distribute_tensor(gb, mesh, {Shard(0)}), b_rep = distribute_tensor(gb, mesh, {Replicate()});
  {
    CommDebugMode comms;
    const at::Tensor out = at::mm(a_rows, b_rep);  // S(0) @ R: no collective
    EXPECT_EQ(spec(out).placements(), Placements{Shard(0)});
    EXPECT_EQ(comms.total(), 0) << comms.table();
  }
  {
    CommDebugMode comms;
    const at::Tensor out = at::mm(a_cols, b_rows);  // S(1) @ S(0) -> P(sum), no collective
    EXPECT_EQ(spec(out).placements(), Placements{Partial()});
    EXPECT_EQ(comms.total(), 0) << comms.table();
    EXPECT_TRUE(at::allclose(full_tensor(out), at::mm(ga, gb)));
  }
  {
    CommDebugMode comms;
    const at::Tensor out = a_rows.sum(0);  // over the sharded dim -> P(sum)
    EXPECT_EQ(spec(out).placements(), Placements{Partial()});
    EXPECT_EQ(comms.total(), 0);
    const at::Tensor kept = a_rows.sum(1);  // over a whole dim: local
    EXPECT_EQ(spec(kept).placements(), Placements{Shard(0)});
    EXPECT_EQ(comms.total(), 0);
  }
  {
    CommDebugMode comms;
    const at::Tensor out = at::softmax(a_rows, 0);  // over the sharded dim: gathered first
    EXPECT_EQ(spec(out).placements(), Placements{Replicate()});
    EXPECT_EQ(comms.count("all_gather"), n > 1 ? 1 : 0) << comms.table();
    EXPECT_TRUE(at::allclose(full_tensor(out), at::softmax(ga, 0)));
  }
  {
    const at::Tensor x = distribute_tensor(same_randn({8, 3, 2}), mesh, {Shard(0)});
    CommDebugMode comms;
    const at::Tensor merged = x.view({24, 2});  // merging a sharded leading dim stays sharded
    EXPECT_EQ(spec(merged).placements(), Placements{Shard(0)});
    EXPECT_EQ(comms.total(), 0);
  }
}

TEST(Kernel, InPlaceOpsUpdateTheCallersTensorAndItsViews) {
  const at::Tensor global = same_randn({10, 4});
  at::Tensor t = rows(global, uneven(10, false));
  at::Tensor view = t.select(1, 2);
  t.mul_(2).add_(1);
  EXPECT_TRUE(at::allclose(full_tensor(t), global * 2 + 1));
  EXPECT_TRUE(at::allclose(full_tensor(view), global.select(1, 2) * 2 + 1));
  view.zero_();
  EXPECT_TRUE(at::allclose(full_tensor(t).select(1, 2), at::zeros({10}, at::kDouble)));
}

TEST(Kernel, InPlaceShapeOpsGiveTheCallersTensorTheOutOfPlaceLayout) {
  // t_, transpose_, unsqueeze_ and squeeze_ change the caller's own tensor as plain torch does:
  // shape, strides, values and gradients as one process, the layout the out-of-place operator
  // gives, no communication. Uneven rows, and rows with an empty shard.
  const int64_t w = mesh_1d().size(0);
  std::vector<int64_t> with_empty = w == 1 ? std::vector<int64_t>{10} : chunk_sizes(10, w - 1);
  if (w > 1) with_empty.insert(with_empty.begin(), 0);
  for (const std::vector<int64_t>& sizes : {uneven(10, false), with_empty}) {
    const at::Tensor global = same_randn({10, 4});
    at::Tensor x = rows(global, sizes);
    const at::Tensor view = x.select(1, 2);
    CommDebugMode comms;
    EXPECT_TRUE(x.t_().is_same(x));
    EXPECT_EQ(x.sizes(), global.t().sizes());
    EXPECT_EQ(x.strides(), global.t().strides());
    EXPECT_EQ(spec(x).placements(), Placements{Shard(1)});
    EXPECT_TRUE(at::equal(full_tensor(x), global.t()));
    x.transpose_(0, -1).unsqueeze_(1);
    EXPECT_EQ(spec(x).placements(), Placements{Shard(0)});
    EXPECT_TRUE(at::equal(full_tensor(x), global.unsqueeze(1)));
    x.squeeze_(1).unsqueeze_(0).unsqueeze_(3).squeeze_();
    EXPECT_EQ(x.sizes(), global.sizes());
    EXPECT_EQ(spec(x).placements(), Placements{Shard(0)});
    EXPECT_TRUE(at::equal(full_tensor(x), global));
    EXPECT_EQ(comms.count("all_gather"), w > 1 ? 3 : 0) << comms.table();  // the three full_tensor calls only
    x.mul_(2);  // the piece is still the one the view sees, as plain torch's would be
    EXPECT_TRUE(at::equal(full_tensor(view), global.select(1, 2) * 2));

    // On a non-leaf, autograd records the in-place op: gradients as one process.
    at::Tensor leaf = rows(global, sizes).requires_grad_();
    at::Tensor y = leaf * 3;
    y.t_().unsqueeze_(0);
    const at::Tensor weight = same_randn({1, 4, 10});
    (y * distribute_tensor(weight, mesh_1d(), {Replicate()})).sum().backward();
    const at::Tensor plain = global.clone().requires_grad_();
    ((plain * 3).t().unsqueeze(0) * weight).sum().backward();
    EXPECT_TRUE(at::allclose(full_tensor(leaf.grad()), plain.grad()));
  }
}

TEST(Kernel, CustomRulesAndLocalMap) {
  // A rule for an operator that has none: nansum over dim 1 of row shards is local (the
  // output keeps the rows' shards).
  register_sharding_rule("aten::nansum", [](const OpMeta& op) {
    RuleResult r;
    r.input_targets = {op.inputs[0].spec};
    r.outputs = {layout_of(op.inputs[0].spec)};
    if (op.arg("dim").toIntVector() != std::vector<int64_t>{1}) return RuleResult::unsupported("only dim [1] is supported by this test rule");
    return r;
  });
  const at::Tensor global = same_randn({10, 4});
  const at::Tensor t = rows(global, uneven(10, false));
  {
    StrictScope strict(true);
    std::optional<CommDebugMode> comms(std::in_place);
    const at::Tensor summed = at::nansum(t, {1});
    EXPECT_EQ(comms->total(), 0) << comms->table();
    comms.reset();
    EXPECT_TRUE(at::allclose(full_tensor(summed), at::nansum(global, {1})));
    EXPECT_ERROR_CONTAINS(at::nansum(t, {0}), "aten::nansum", "only dim [1] is supported");
  }
  EXPECT_ERROR_CONTAINS(register_sharding_rule("nansum", nullptr), "not a qualified operator name");

  const std::vector<at::Tensor> out = local_map(
      [](const std::vector<at::Tensor>& locals) { return std::vector<at::Tensor>{locals[0].cumsum(0)}; }, {t},
      {Placements{Replicate()}}, {Placements{Replicate()}});
  EXPECT_TRUE(at::allclose(full_tensor(out[0]), at::cumsum(global, 0)));
  const std::vector<at::Tensor> rowwise = local_map(
      [](const std::vector<at::Tensor>& locals) { return std::vector<at::Tensor>{locals[0] * 3}; }, {t}, {}, {Placements{Shard(0)}});
  EXPECT_EQ(spec(rowwise[0]).shard_sizes(), spec(t).shard_sizes());
  EXPECT_TRUE(at::allclose(full_tensor(rowwise[0]), global * 3));
}
