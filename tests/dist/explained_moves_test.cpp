// What explain promises is what runs: for every rule family whose kernel moves bytes between
// ranks, and for an operator whose inputs are redistributed, the collectives CommDebugMode
// counts while the operator runs equal the steps its propagation declares (each input's
// redistribute steps and the kernel plan's moves, by the names they are counted as), on every
// rank, at 1-4 ranks, on uneven shards.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/version.h>

#include <map>
#include <string>
#include <vector>

#include "dispatch/propagation.h"
#include "dist/dist_fixture.h"
#include "rules/kernel_plan.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

using Counts = std::map<std::string, int64_t>;

const DeviceMesh& world_mesh() {
  static const DeviceMesh mesh = DeviceMesh::create({world_size()});
  return mesh;
}

// `total` rows split unevenly over the ranks: the last rank holds one row more than the rest.
ShardSizes uneven(int64_t dim, int64_t rows_each) {
  std::vector<int64_t> sizes(static_cast<size_t>(world_size()), rows_each);
  sizes.back() += 1;
  return ShardSizes{{dim, sizes}};
}
int64_t uneven_total(int64_t rows_each) { return rows_each * world_size() + 1; }

c10::OperatorHandle operator_named(const std::string& name, const std::string& overload = "") {
  const auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(handle.has_value(), "no operator ", name, ".", overload);
  return *handle;
}

// The collectives the propagation of `op` on `args` declares, by their CommDebugMode names.
Counts explained(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  const Propagation& p = propagate(op, args);
  Counts counts;
  for (const auto& plan : p.plans)
    if (plan)
      for (const PlannedStep& step : plan->steps)
        if (step.transport.kind != TransportKind::None) ++counts[step.transport.counted_as];
  if (p.result.kernel_plan)
    for (const MoveStep& move : p.result.kernel_plan->moves()) counts[counted_as(move)] += batches_of(move);
  return counts;
}

// The collectives running `op` on `args` makes; `outputs` gets what it returned.
Counts counted(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, torch::jit::Stack* outputs = nullptr) {
  torch::jit::Stack stack(args.begin(), args.end());
  CommDebugMode comms;
  op.callBoxed(&stack);
  if (outputs) *outputs = stack;
  Counts counts;
  for (const auto& [kind, n] : comms.counts())
    if (n > 0) counts[kind] = n;
  return counts;
}

std::string to_string(const Counts& counts) {
  std::string out = "{";
  for (const auto& [kind, n] : counts) out += " " + kind + ": " + std::to_string(n);
  return out + " }";
}

// The check itself; `moves_somewhere` says whether, at this world size, the call must move
// bytes (so that a family whose declared moves are dropped on every path cannot pass).
void expect_counted_as_explained(const std::string& what, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                 bool moves_somewhere, torch::jit::Stack* outputs = nullptr) {
  SCOPED_TRACE(what);
  const Counts declared = explained(op, args);
  const Counts made = counted(op, args, outputs);
  EXPECT_EQ(to_string(made), to_string(declared)) << "counted (left) against explained (right)";
  if (moves_somewhere) EXPECT_FALSE(declared.empty()) << "this call must move bytes at " << world_size() << " ranks";
}

std::vector<int64_t> pair(int64_t v) { return {v, v}; }

}  // namespace

TEST(ExplainedMoves, HaloFamiliesCountWhatTheyDeclare) {
  const at::NoGradGuard no_grad;  // no rows kept for a backward: each call gathers its own window
  const bool split = world_size() > 1;
  const int64_t h = uneven_total(3);
  const at::Tensor x = distribute_tensor(draw_double({2, 3, h, 5}, 1), world_mesh(), {Shard(2)}, uneven(2, 3));
  const at::Tensor w = distribute_tensor(draw_double({4, 3, 3, 3}, 2), world_mesh(), {Replicate()});
  const at::Tensor wt = distribute_tensor(draw_double({3, 4, 3, 3}, 3), world_mesh(), {Replicate()});
  const c10::IValue none;

  const auto conv = operator_named("aten::convolution");
  expect_counted_as_explained("convolution", conv, {x, w, none, pair(1), pair(1), pair(1), false, pair(0), int64_t{1}}, split);
  expect_counted_as_explained("transposed convolution", conv, {x, wt, none, pair(1), pair(1), pair(1), true, pair(0), int64_t{1}}, split);
  const at::Tensor grad = distribute_tensor(draw_double({2, 4, h, 5}, 4), world_mesh(), {Shard(2)}, uneven(2, 3));
  expect_counted_as_explained("convolution_backward", operator_named("aten::convolution_backward"),
                              {grad, x, w, c10::IValue(std::vector<int64_t>{4}), pair(1), pair(1), pair(1), false, pair(0), int64_t{1},
                               c10::List<bool>({true, true, true})},
                              split);
  expect_counted_as_explained("max_pool2d", operator_named("aten::max_pool2d_with_indices"),
                              {x, pair(3), pair(1), pair(1), pair(1), false}, split);
  expect_counted_as_explained("avg_pool2d", operator_named("aten::avg_pool2d"),
                              {x, pair(3), pair(1), pair(1), false, true, none}, split);
  expect_counted_as_explained("upsample_bilinear2d", operator_named("aten::upsample_bilinear2d"),
                              {x, std::vector<int64_t>{2 * h, 10}, false, none, none}, split);
  // Reflection reaches into a neighbour where the first shard is thinner than the padding.
  std::vector<int64_t> thin_first(static_cast<size_t>(world_size()), 4);
  thin_first[0] = split ? 1 : 4;
  int64_t thin_total = 0;
  for (int64_t rows : thin_first) thin_total += rows;
  const at::Tensor thin = distribute_tensor(draw_double({2, 3, thin_total, 5}, 5), world_mesh(), {Shard(2)}, ShardSizes{{2, thin_first}});
  expect_counted_as_explained("reflection_pad2d", operator_named("aten::reflection_pad2d"), {thin, std::vector<int64_t>{1, 1, 2, 2}},
                              split);
}

TEST(ExplainedMoves, StatisticsReductionsCountWhatTheyDeclare) {
  const at::NoGradGuard no_grad;
  const bool split = world_size() > 1;
  const int64_t n = uneven_total(2);
  const c10::IValue none;
  // Layer norm over a split feature dim: the row statistics are summed over the ranks.
  const at::Tensor rows = distribute_tensor(draw_double({3, n}, 5), world_mesh(), {Shard(1)}, uneven(1, 2));
  expect_counted_as_explained("native_layer_norm", operator_named("aten::native_layer_norm"),
                              {rows, std::vector<int64_t>{n}, none, none, 1e-5}, split);
  // Batch norm in training on a split batch; group norm on a split spatial dim.
  const at::Tensor images = distribute_tensor(draw_double({n, 4, 3, 3}, 6), world_mesh(), {Shard(0)}, uneven(0, 2));
  expect_counted_as_explained("native_batch_norm", operator_named("aten::native_batch_norm"),
                              {images, none, none, none, none, true, 0.1, 1e-5}, split);
  const at::Tensor field = distribute_tensor(draw_double({2, 4, n, 3}, 7), world_mesh(), {Shard(2)}, uneven(2, 2));
  expect_counted_as_explained("native_group_norm", operator_named("aten::native_group_norm"),
                              {field, none, none, int64_t{2}, int64_t{4}, int64_t{n * 3}, int64_t{2}, 1e-5}, split);
  // A mean loss over split rows, and a comparison of two split tensors.
  const at::Tensor target = distribute_tensor(draw_double({n, 4, 3, 3}, 8), world_mesh(), {Shard(0)}, uneven(0, 2));
  // mse_loss's mean leaves a pending sum (nothing moves in the op); nll_loss's mean divides by a
  // total weight summed over the ranks.
  expect_counted_as_explained("mse_loss", operator_named("aten::mse_loss"), {images, target, int64_t{1}}, false);
  const at::Tensor log_probs = distribute_tensor(at::log_softmax(draw_double({n, 5}, 15), 1), world_mesh(), {Shard(0)}, uneven(0, 2));
  at::manual_seed(16);
  const at::Tensor classes = distribute_tensor(at::randint(0, 5, {n}, at::kLong), world_mesh(), {Shard(0)}, uneven(0, 2));
  expect_counted_as_explained("nll_loss", operator_named("aten::nll_loss_forward"), {log_probs, classes, none, int64_t{1}, int64_t{-100}},
                              split);
  expect_counted_as_explained("equal", operator_named("aten::equal"), {images, target}, split);
}

TEST(ExplainedMoves, RedistributedInputsCountTheirPlannedSteps) {
  const at::NoGradGuard no_grad;
  const int64_t n = uneven_total(2);
  const at::Tensor by_rows = distribute_tensor(draw_double({n, n}, 9), world_mesh(), {Shard(0)}, uneven(0, 2));
  const at::Tensor by_cols = distribute_tensor(draw_double({n, n}, 10), world_mesh(), {Shard(1)}, uneven(1, 2));
  expect_counted_as_explained("add of rows and columns", operator_named("aten::add", "Tensor"), {by_rows, by_cols, int64_t{1}},
                              world_size() > 1);
  expect_counted_as_explained("softmax over the split dim", operator_named("aten::_softmax"), {by_cols, int64_t{1}, false},
                              world_size() > 1);
}

TEST(ExplainedMoves, RandomDrawsCheckTheirProbabilitiesAsDeclared) {
  const at::NoGradGuard no_grad;
  const int64_t n = uneven_total(2);
  const at::Tensor p = distribute_tensor(at::full({n, 3}, 0.25, at::kDouble), world_mesh(), {Shard(0)}, uneven(0, 2));
  expect_counted_as_explained("bernoulli of split probabilities", operator_named("aten::bernoulli"), {p, c10::IValue()},
                              world_size() > 1);
  expect_counted_as_explained("multinomial of split rows", operator_named("aten::multinomial"), {p, int64_t{2}, true, c10::IValue()},
                              world_size() > 1);
}

TEST(ExplainedMoves, RingAttentionCountsItsBatchesAsDeclared) {
  const auto flash = c10::Dispatcher::singleton().findSchema({"aten::_scaled_dot_product_flash_attention_for_cpu", ""});
  if (!flash) GTEST_SKIP() << "aten::_scaled_dot_product_flash_attention_for_cpu does not exist in libtorch " << TORCH_VERSION_MAJOR << "."
                           << TORCH_VERSION_MINOR << " (it comes with torch 2.2)";
  const auto backward = operator_named("aten::_scaled_dot_product_flash_attention_for_cpu_backward");
  const at::NoGradGuard no_grad;
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < world_size(); ++r) sizes.push_back(2 + r);  // uneven, none empty
  int64_t s = 0;
  for (int64_t size : sizes) s += size;
  const c10::IValue none;
  auto seq = [&](uint64_t seed) { return distribute_tensor(draw_double({1, 2, s, 4}, seed), world_mesh(), {Shard(2)}, ShardSizes{{2, sizes}}); };
  const at::Tensor q = seq(11), k = seq(12), v = seq(13), grad_out = seq(14);
  for (const bool causal : {false, true}) {
    const std::string how = causal ? "causal " : "";
    torch::jit::Stack outputs;
    expect_counted_as_explained(how + "ring attention", *flash, {q, k, v, 0.0, causal, none, none}, world_size() > 1, &outputs);
    ASSERT_EQ(outputs.size(), 2u);
    expect_counted_as_explained(how + "ring attention backward", backward,
                                {grad_out, q, k, v, outputs[0], outputs[1], 0.0, causal, none, none}, world_size() > 1);
  }
}
