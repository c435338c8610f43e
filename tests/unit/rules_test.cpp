// Sharding rules, one process, no communication: every rule family is called on specs over a
// mesh without communicators (DeviceMesh::without_comms), and its answer is checked as a table
// row: (op, input specs, args) -> (input targets, output layouts, declared moves). A rule that
// reached for a communicator, or ran its kernel, would raise here instead of planning.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <sstream>

#include "rules/attention.h"
#include "rules/helpers.h"
#include "rules/kernel_plan.h"
#include "rules/registry.h"
#include "util/strings.h"

using namespace shardtensor;

namespace {

// One argument of the call: a tensor given by its spec, or any other value.
struct Arg {
  Arg(ShardTensorSpec s) : spec(std::move(s)) {}  // NOLINT: a table reads better without wrappers
  Arg(c10::IValue v) : value(std::move(v)) {}     // NOLINT
  Arg(int64_t v) : value(v) {}                    // NOLINT
  Arg(double v) : value(v) {}                     // NOLINT
  Arg(bool v) : value(v) {}                       // NOLINT
  Arg(std::vector<int64_t> v) : value(std::move(v)) {}  // NOLINT
  std::optional<ShardTensorSpec> spec;
  c10::IValue value;
};

const c10::IValue kNone;

// What a rule answered, as the strings a table compares.
struct Answer {
  std::string targets;  // input targets, "S(0) | R"
  std::string outputs;  // output placements with their size tables, "S(2){2: 4,4,4,4} | R"
  std::string moves;    // the kernel plan's declared moves, "none" without any
  std::string kernel;   // the kernel plan's name, "" without one
};

std::string sizes_of(const ShardSizes& sizes) {
  std::string out;
  for (const DimShardSizes& entry : sizes) out += "{" + std::to_string(entry.tensor_dim) + ": " + join(entry.sizes, ",") + "}";
  return out;
}

// The rule's answer for `op` on `args` (no rule: a failed expectation and an empty answer).
RuleResult apply_rule(const std::string& op, const std::vector<Arg>& args) {
  const size_t dot = op.find('.');
  const std::string name = op.substr(0, dot), overload = dot == std::string::npos ? "" : op.substr(dot + 1);
  const c10::OperatorHandle handle = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  OpMeta meta;
  meta.name = op;
  meta.schema = &handle.schema();
  std::vector<c10::IValue> values;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].spec) meta.inputs.push_back({*args[i].spec, i, false});
    values.push_back(args[i].spec ? c10::IValue(at::Tensor()) : args[i].value);  // rules never read tensor data
  }
  meta.args = values;
  const Rule* rule = rule_registry().find(op);
  EXPECT_NE(rule, nullptr) << "no rule for " << op;
  return rule ? (*rule)(meta) : RuleResult{};
}

Answer call_rule(const std::string& op, const std::vector<Arg>& args) {
  const RuleResult r = apply_rule(op, args);
  EXPECT_EQ(r.unsupported_reason, "") << op;
  EXPECT_FALSE(r.local_kernel) << op << ": built-in rules declare kernel plans, not closures";
  Answer a;
  std::vector<std::string> parts;
  for (const ShardTensorSpec& t : r.input_targets) parts.push_back(to_string(t.placements()) + sizes_of(t.shard_sizes()));
  a.targets = join(parts, " | ");
  parts.clear();
  for (const OutputLayout& o : r.outputs) parts.push_back(to_string(o.placements) + sizes_of(o.sizes));
  a.outputs = join(parts, " | ");
  parts.clear();
  if (r.kernel_plan)
    for (const MoveStep& m : r.kernel_plan->moves()) parts.push_back(to_string(m));
  a.moves = parts.empty() ? "none" : join(parts, "; ");
  a.kernel = r.kernel_plan ? r.kernel_plan->name() : "";
  return a;
}

// A spec on a mesh of `mesh_shape` seen from rank `rank` (no communicators).
ShardTensorSpec spec(std::vector<int64_t> mesh_shape, Placements ps, std::vector<int64_t> shape, ShardSizes sizes = {},
                     int64_t rank = 0) {
  return ShardTensorSpec(DeviceMesh::without_comms(std::move(mesh_shape), rank), std::move(ps), std::move(shape), c10::kFloat,
                         std::move(sizes));
}

}  // namespace

// ---- pointwise ----

TEST(PointwiseRules, ShardedOperandsMeetPieceByPieceWithoutMoves) {
  const auto x = spec({4}, {Shard(0)}, {10, 3});
  const Answer a = call_rule("aten::mul.Tensor", {x, x});
  EXPECT_EQ(a.targets, "[S(0)]{0: 3,3,3,1} | [S(0)]{0: 3,3,3,1}");  // torch.chunk sizes
  EXPECT_EQ(a.outputs, "[S(0)]{0: 3,3,3,1}");
  EXPECT_EQ(a.moves, "none");
}

TEST(PointwiseRules, UnevenOperandIsAlignedToTheFirstOperandsSizes) {
  const auto x = spec({4}, {Shard(0)}, {10}, {{0, {1, 4, 0, 5}}});
  const auto y = spec({4}, {Shard(0)}, {10});
  EXPECT_EQ(call_rule("aten::add.Tensor", {x, y, int64_t{1}}).targets, "[S(0)]{0: 1,4,0,5} | [S(0)]{0: 1,4,0,5}");
}

// ---- reductions ----

TEST(ReductionRules, SumOverAShardedDimIsPartialAndMovesNothing) {
  const auto x = spec({4}, {Shard(0)}, {8, 3});
  const Answer a = call_rule("aten::sum.dim_IntList", {x, std::vector<int64_t>{0}, false, kNone});
  EXPECT_EQ(a.outputs, "[P(sum)]");
  EXPECT_EQ(a.moves, "none");
}

TEST(ReductionRules, MeanOverAShardedDimDividesByTheGlobalCountLocally) {
  const auto x = spec({4}, {Shard(0)}, {8, 3});
  const Answer a = call_rule("aten::mean.dim", {x, std::vector<int64_t>{0}, false, kNone});
  EXPECT_EQ(a.outputs, "[P(sum)]");
  EXPECT_NE(a.kernel, "");
  EXPECT_EQ(a.moves, "none");
}

TEST(ReductionRules, VectorNormsOverShardsArePendingNormsOfTheLocalNorms) {
  const auto x = spec({4}, {Shard(0)}, {8, 3});
  auto norm = [&](const ShardTensorSpec& in, double p) {
    return call_rule("aten::linalg_vector_norm", {in, p, std::vector<int64_t>{0}, false, kNone});
  };
  EXPECT_EQ(norm(x, 2.0).outputs, "[P(norm2)]");  // DTensor's _NormPartial: no collective
  EXPECT_EQ(norm(x, 2.0).moves, "none");
  EXPECT_EQ(norm(x, 3.5).outputs, "[P(norm3.5)]");
  EXPECT_EQ(norm(x, 1.0).outputs, "[P(sum)]");     // the same pending reduction, by its usual name
  EXPECT_EQ(norm(x, 0.0).outputs, "[P(sum)]");     // a count
  EXPECT_EQ(norm(x, INFINITY).outputs, "[P(max)]");
  EXPECT_EQ(norm(x, -INFINITY).outputs, "[P(min)]");
  // The norm of pending norms of the same order stays pending (clip_grad_norm_'s norm of the
  // gradients' norms); of another order, or of a pending sum (its terms may be negative), it is resolved.
  const auto pending = spec({4}, {NormPartial(2.0)}, {5});
  EXPECT_EQ(call_rule("aten::linalg_vector_norm", {pending, 2.0, kNone, false, kNone}).outputs, "[P(norm2)]");
  EXPECT_EQ(call_rule("aten::linalg_vector_norm", {pending, 2.0, kNone, false, kNone}).targets, "[P(norm2)]");
  EXPECT_EQ(call_rule("aten::linalg_vector_norm", {pending, 3.0, kNone, false, kNone}).targets, "[R]");
  EXPECT_EQ(call_rule("aten::linalg_vector_norm", {spec({4}, {Partial()}, {5}), 1.0, kNone, false, kNone}).targets, "[R]");
}

// ---- matmul ----

TEST(MatmulRules, RowShardedTimesReplicatedStaysRowSharded) {
  const Answer a = call_rule("aten::mm", {spec({4}, {Shard(0)}, {8, 6}), spec({4}, {Replicate()}, {6, 5})});
  EXPECT_EQ(a.outputs, "[S(0)]{0: 2,2,2,2}");
  EXPECT_EQ(a.moves, "none");
}

TEST(MatmulRules, ContractingShardedDimsGivesPartialSum) {
  const Answer a = call_rule("aten::mm", {spec({4}, {Shard(1)}, {8, 6}), spec({4}, {Shard(0)}, {6, 5})});
  EXPECT_EQ(a.targets, "[S(1)]{1: 2,2,2,0} | [S(0)]{0: 2,2,2,0}");
  EXPECT_EQ(a.outputs, "[P(sum)]");
}

TEST(MatmulRules, AReplicatedOperandIsCutToItsPartnersUnevenSplit) {
  // A weight gradient's mm: the replicated side is sliced to the rows the other side already
  // holds, so nothing moves (cut to even sizes, the split side would need an all-to-all).
  const Answer a = call_rule("aten::mm", {spec({2}, {Replicate()}, {8, 22}), spec({2}, {Shard(0)}, {22, 5}, {{0, {12, 10}}})});
  EXPECT_EQ(a.targets, "[S(1)]{1: 12,10} | [S(0)]{0: 12,10}");
  EXPECT_EQ(a.outputs, "[P(sum)]");
  // Both split already: the second follows the first.
  const Answer b = call_rule("aten::mm", {spec({2}, {Shard(1)}, {8, 22}, {{1, {9, 13}}}), spec({2}, {Shard(0)}, {22, 5}, {{0, {12, 10}}})});
  EXPECT_EQ(b.targets, "[S(1)]{1: 9,13} | [S(0)]{0: 9,13}");
}

// ---- views ----

TEST(ViewRules, SplittingAnUnshardedDimKeepsTheSharding) {
  const Answer a = call_rule("aten::view", {spec({4}, {Shard(0)}, {8, 4}), std::vector<int64_t>{8, 2, 2}});
  EXPECT_EQ(a.targets, "[S(0)]{0: 2,2,2,2}");
  EXPECT_EQ(a.outputs, "[S(0)]{0: 2,2,2,2}");
  EXPECT_EQ(a.moves, "none");
}

// ---- layer norm, losses, embedding ----

TEST(NormalizationRules, LayerNormOverWholeRowsIsLocal) {
  const auto x = spec({4}, {Shard(0)}, {8, 6});
  const Answer a = call_rule("aten::native_layer_norm", {x, std::vector<int64_t>{6}, kNone, kNone, 1e-5});
  EXPECT_EQ(a.targets, "[S(0)]{0: 2,2,2,2}");
  EXPECT_EQ(a.moves, "none");
}

TEST(LossRules, MeanSquaredErrorOverShardsSumsThenDividesLocally) {
  const auto x = spec({4}, {Shard(0)}, {8, 6});
  const Answer a = call_rule("aten::mse_loss", {x, x, int64_t{1}});  // reduction: mean
  EXPECT_EQ(a.outputs, "[P(sum)]");
  EXPECT_EQ(a.moves, "none");
}

TEST(EmbeddingRules, ShardedIndicesGiveShardedRows) {
  const Answer a = call_rule("aten::embedding", {spec({4}, {Replicate()}, {10, 3}), spec({4}, {Shard(0)}, {8}), int64_t{-1}, false, false});
  EXPECT_EQ(a.outputs, "[S(0)]{0: 2,2,2,2}");
  EXPECT_EQ(a.moves, "none");
}

TEST(EmbeddingRules, AVocabShardedTableLooksUpItsOwnRowsIntoAPendingSum) {
  const auto table = spec({2, 2}, {Shard(0), Replicate()}, {10, 3}, {{0, {7, 3}}});
  const Answer a = call_rule("aten::embedding", {table, spec({2, 2}, {Replicate(), Shard(0)}, {4, 5}), int64_t{2}, false, false});
  EXPECT_EQ(a.targets, "[S(0), R]{0: 7,3} | [R, S(0)]{0: 2,2}");  // the table is not gathered
  EXPECT_EQ(a.outputs, "[P(sum), S(0)]{0: 2,2}");
  EXPECT_EQ(a.moves, "none");
  EXPECT_NE(a.kernel, "");
  // Indices split where the table is: the table is replicated.
  const Answer split = call_rule("aten::embedding", {table, spec({2, 2}, {Shard(0), Replicate()}, {4, 5}), int64_t{-1}, false, false});
  EXPECT_EQ(split.targets, "[R, R] | [S(0), R]{0: 2,2}");
  EXPECT_EQ(split.kernel, "");
  // A table split on the embedding dim (colwise) with whole indices: looked up where it lies,
  // the output split on its last dim alike, no move.
  const Answer columns = call_rule("aten::embedding", {spec({4}, {Shard(1)}, {10, 8}), spec({4}, {Replicate()}, {6}), int64_t{-1}, false, false});
  EXPECT_EQ(columns.targets, "[S(1)]{1: 2,2,2,2} | [R]");
  EXPECT_EQ(columns.outputs, "[S(1)]{1: 2,2,2,2}");
  EXPECT_EQ(columns.moves, "none");
}

// ---- convolution ----

namespace {
Answer conv2d(const ShardTensorSpec& in, int64_t kernel, int64_t padding, int64_t stride = 1) {
  return call_rule("aten::convolution", {in, spec(in.mesh().shape(), Placements(in.mesh().ndim(), Replicate()), {5, 3, kernel, kernel}),
                                         kNone, std::vector<int64_t>{stride}, std::vector<int64_t>{padding}, std::vector<int64_t>{1},
                                         false, std::vector<int64_t>{0}, int64_t{1}});
}
}  // namespace

TEST(ConvolutionRules, A3x3ConvolutionGathersTheHaloOfItsShardedDim) {
  const Answer a = conv2d(spec({4}, {Shard(2)}, {2, 3, 16, 16}), 3, 1);
  EXPECT_EQ(a.targets, "[S(2)]{2: 4,4,4,4} | [R]");
  EXPECT_EQ(a.outputs, "[S(2)]{2: 4,4,4,4}");
  EXPECT_EQ(a.moves, "HaloGather(mesh_dim=0, tensor_dim=2)");
  EXPECT_EQ(a.kernel, "halo convolution (forward)");
}

TEST(ConvolutionRules, OutputShardsFollowUnevenInputShardsUnderAStride) {
  const Answer a = conv2d(spec({4}, {Shard(3)}, {1, 3, 8, 16}, {{3, {6, 0, 7, 3}}}), 3, 1, 2);
  EXPECT_EQ(a.outputs, "[S(3)]{3: 3,0,4,1}");  // rank r: outputs whose windows start in its rows
  EXPECT_EQ(a.moves, "HaloGather(mesh_dim=0, tensor_dim=3)");
}

TEST(ConvolutionRules, APointwiseConvolutionMovesNothing) {
  EXPECT_EQ(conv2d(spec({4}, {Shard(2)}, {2, 3, 16, 16}), 1, 0).moves, "none");
}

TEST(ConvolutionRules, ChannelShardingIsGatheredAndTwoSpatialDimsExchangeInOrder) {
  const Answer a = conv2d(spec({2, 2}, {Shard(2), Shard(1)}, {1, 4, 8, 8}), 3, 1);
  EXPECT_EQ(a.targets, "[S(2), R]{2: 4,4} | [R, R]");
  EXPECT_EQ(conv2d(spec({2, 2}, {Shard(2), Shard(3)}, {1, 3, 8, 8}), 3, 1).moves,
            "HaloGather(mesh_dim=0, tensor_dim=2); HaloGather(mesh_dim=1, tensor_dim=3)");
}

TEST(ConvolutionRules, BackwardGathersTheWindowAndScattersItsGradientBack) {
  const auto in = spec({4}, {Shard(2)}, {2, 3, 16, 16});
  const auto grad = spec({4}, {Shard(2)}, {2, 5, 16, 16});
  const auto weight = spec({4}, {Replicate()}, {5, 3, 3, 3});
  c10::List<bool> mask({true, true, true});
  const Answer a = call_rule("aten::convolution_backward",
                             {grad, in, weight, c10::IValue(std::vector<int64_t>{5}), std::vector<int64_t>{1},
                              std::vector<int64_t>{1}, std::vector<int64_t>{1}, false, std::vector<int64_t>{0}, int64_t{1},
                              c10::IValue(mask)});
  EXPECT_EQ(a.outputs, "[S(2)]{2: 4,4,4,4} | [P(sum)] | [P(sum)]");
  // The window's gather is skipped where the forward kept its rows (one split axis: here).
  EXPECT_EQ(a.moves,
            "HaloGather(mesh_dim=0, tensor_dim=2, none where the forward kept the rows it received); "
            "HaloScatterAdd(mesh_dim=0, tensor_dim=2)");
}

// ---- pooling ----

TEST(PoolingRules, NonOverlappingWindowsInsideShardsMoveNothing) {
  const Answer a = call_rule("aten::max_pool2d_with_indices",
                             {spec({4}, {Shard(2)}, {1, 2, 16, 8}), std::vector<int64_t>{2, 2}, std::vector<int64_t>{2, 2},
                              std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 1}, false});
  EXPECT_EQ(a.outputs, "[S(2)]{2: 2,2,2,2} | [S(2)]{2: 2,2,2,2}");
  EXPECT_EQ(a.moves, "none");
}

TEST(PoolingRules, OverlappingWindowsGatherAHalo) {
  const Answer a = call_rule("aten::avg_pool2d", {spec({4}, {Shard(2)}, {1, 2, 16, 8}), std::vector<int64_t>{3, 3},
                                                  std::vector<int64_t>{1, 1}, std::vector<int64_t>{1, 1}, false, true, kNone});
  EXPECT_EQ(a.outputs, "[S(2)]{2: 4,4,4,4}");
  EXPECT_EQ(a.moves, "HaloGather(mesh_dim=0, tensor_dim=2)");
}

// ---- resampling ----

TEST(ResamplingRules, NearestUpsamplingByTwoStaysInsideShards) {
  const Answer a = call_rule("aten::upsample_nearest2d",
                             {spec({4}, {Shard(2)}, {1, 1, 8, 8}), std::vector<int64_t>{16, 16}, kNone, kNone});
  EXPECT_EQ(a.outputs, "[S(2)]{2: 4,4,4,4}");
  EXPECT_EQ(a.moves, "none");
}

TEST(ResamplingRules, BilinearUpsamplingReadsTheNextShardsFirstRow) {
  const Answer a = call_rule("aten::upsample_bilinear2d",
                             {spec({4}, {Shard(2)}, {1, 1, 8, 8}), std::vector<int64_t>{16, 16}, false, kNone, kNone});
  EXPECT_EQ(a.moves, "HaloGather(mesh_dim=0, tensor_dim=2)");
}

TEST(ResamplingRules, ConstantPaddingOfAShardedDimShiftsOwnershipAndMovesNothing) {
  // Every rank owns the outputs opposite its rows, so its window is its own rows plus fill.
  Answer a = call_rule("aten::constant_pad_nd", {spec({4}, {Shard(1)}, {2, 8}), std::vector<int64_t>{1, 2}, 0.0});
  EXPECT_EQ(a.outputs, "[S(1)]{1: 3,2,2,4}");  // the first rank takes the front pad, the last the back
  EXPECT_EQ(a.moves, "none");
  a = call_rule("aten::constant_pad_nd", {spec({4}, {Shard(1)}, {2, 8}), std::vector<int64_t>{-1, -2}, 0.0});
  EXPECT_EQ(a.outputs, "[S(1)]{1: 1,2,2,0}");  // a crop takes the first row from rank 0, the last two from rank 3
  EXPECT_EQ(a.moves, "none");
}

// ---- batch and group norm ----

TEST(SpatialNormRules, TrainingBatchNormSumsStatisticsOverEveryShardingMeshDim) {
  const auto x = spec({2, 2}, {Shard(0), Shard(2)}, {4, 3, 8, 8});
  const auto c = spec({2, 2}, {Replicate(), Replicate()}, {3});
  const Answer a = call_rule("aten::native_batch_norm", {x, c, c, c, c, true, 0.1, 1e-5});
  EXPECT_EQ(a.outputs, "[S(0), S(2)]{0: 2,2}{2: 4,4} | [R, R] | [R, R]");
  EXPECT_EQ(a.moves, "AllReduce(mesh_dim=0, sum); AllReduce(mesh_dim=1, sum)");
}

TEST(SpatialNormRules, GroupNormSplitOnlyOnTheBatchIsLocal) {
  const auto x = spec({4}, {Shard(0)}, {8, 4, 6, 6});
  const auto c = spec({4}, {Replicate()}, {4});
  const Answer a = call_rule("aten::native_group_norm", {x, c, c, int64_t{8}, int64_t{4}, int64_t{36}, int64_t{2}, 1e-5});
  EXPECT_EQ(a.outputs, "[S(0)]{0: 2,2,2,2} | [S(0)]{0: 2,2,2,2} | [S(0)]{0: 2,2,2,2}");
  EXPECT_EQ(a.moves, "none");
}

// ---- random, indexing ----

TEST(RandomRules, UniformDrawsInPlaceOnAnyLayoutWithoutMoves) {
  const Answer a = call_rule("aten::uniform_", {spec({4}, {Shard(1)}, {3, 10}), 0.0, 1.0, kNone});
  EXPECT_EQ(a.targets, "[S(1)]{1: 3,3,3,1}");
  EXPECT_EQ(a.moves, "none");
}

TEST(RandomRules, RandomIntegersCheckTheirRangeOnEveryOverload) {
  const auto self = spec({4}, {Shard(0)}, {8, 5});
  EXPECT_EQ(call_rule("aten::random_.from", {self, int64_t{2}, int64_t{9}, kNone}).targets, "[S(0)]{0: 2,2,2,2}");
  EXPECT_EQ(call_rule("aten::random_.to", {self, int64_t{9}, kNone}).moves, "none");
  EXPECT_EQ(call_rule("aten::random_", {self, kNone}).moves, "none");
  try {
    call_rule("aten::random_.from", {self, int64_t{9}, int64_t{2}, kNone});
    ADD_FAILURE() << "random_(from=9, to=2) was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("aten::random_.from: 'from' (9) must be less than 'to' (2)"), std::string::npos) << e.what();
  }
}

TEST(RandomRules, BernoulliAndLikeFactoriesDrawOnTheirInputsLayoutWithoutMoves) {
  const auto self = spec({4}, {Shard(1)}, {3, 10});
  EXPECT_EQ(call_rule("aten::bernoulli", {self, kNone}).outputs, "[S(1)]{1: 3,3,3,1}");
  EXPECT_EQ(call_rule("aten::bernoulli.p", {self, 0.5, kNone}).moves, "none");
  EXPECT_EQ(call_rule("aten::rand_like", {self, kNone, kNone, kNone, kNone, kNone}).outputs, "[S(1)]{1: 3,3,3,1}");
  // A p that broadcasts comes whole; sharded probabilities are checked with one sum of flags.
  const Answer broadcast = call_rule("aten::bernoulli_.Tensor", {self, spec({4}, {Replicate()}, {10}), kNone});
  EXPECT_EQ(broadcast.targets, "[S(1)]{1: 3,3,3,1} | [R]");
  EXPECT_EQ(broadcast.moves, "none");
  EXPECT_EQ(call_rule("aten::bernoulli", {self, kNone}).moves, "AllReduce(mesh_dim=0, sum)");
  try {
    call_rule("aten::bernoulli.p", {self, 1.5, kNone});
    ADD_FAILURE() << "bernoulli(p=1.5) was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expects p to be in [0, 1], but got p=1.5"), std::string::npos) << e.what();
  }
}

TEST(RandomRules, MultinomialKeepsRowsShardedAndGathersCategories) {
  const Answer a = call_rule("aten::multinomial", {spec({2, 2}, {Shard(0), Shard(1)}, {6, 5}), int64_t{3}, false, kNone});
  EXPECT_EQ(a.targets, "[S(0), R]{0: 3,3}");
  EXPECT_EQ(a.outputs, "[S(0), R]{0: 3,3}");
  try {
    call_rule("aten::multinomial", {spec({4}, {Replicate()}, {6, 5}), int64_t{6}, false, kNone});
    ADD_FAILURE() << "6 samples of 5 categories without replacement were accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot sample n_sample > prob_dist.size(-1) samples without replacement"),
              std::string::npos)
        << e.what();
  }
}

TEST(IndexingRules, GatherAlongAnUnshardedDimKeepsTheIndexLayout) {
  const auto self = spec({4}, {Shard(0)}, {8, 5});
  const auto index = spec({4}, {Shard(0)}, {8, 2});
  const Answer a = call_rule("aten::gather", {self, int64_t{1}, index, false});
  EXPECT_EQ(a.outputs, "[S(0)]{0: 2,2,2,2}");
  EXPECT_EQ(a.moves, "none");
}

TEST(IndexingRules, GatherAndIndexSelectAlongASplitDimAnswerTheirOwnRangeIntoAPendingSum) {
  const auto self = spec({2, 2}, {Shard(1), Replicate()}, {4, 10, 3}, {{1, {7, 3}}});
  const auto index = spec({2, 2}, {Replicate(), Replicate()}, {4, 6, 3});
  const Answer gather = call_rule("aten::gather", {self, int64_t{1}, index, false});
  EXPECT_EQ(gather.targets, "[S(1), R]{1: 7,3} | [R, R]");  // self is not gathered
  EXPECT_EQ(gather.outputs, "[P(sum), R]");
  EXPECT_EQ(gather.moves, "none");
  EXPECT_NE(gather.kernel, "");
  const Answer select = call_rule("aten::index_select", {self, int64_t{-2}, spec({2, 2}, {Replicate(), Replicate()}, {5})});
  EXPECT_EQ(select.targets, "[S(1), R]{1: 7,3} | [R, R]");
  EXPECT_EQ(select.outputs, "[P(sum), R]");
  EXPECT_EQ(select.moves, "none");
  EXPECT_NE(select.kernel, "");
  // gather's backward adds each rank's entries into its own range: self's layout, no move.
  const Answer back = call_rule("aten::gather_backward", {spec({2, 2}, {Replicate(), Replicate()}, {4, 6, 3}), self, int64_t{1}, index, false});
  EXPECT_EQ(back.targets, "[R, R] | [S(1), R]{1: 7,3} | [R, R]");
  EXPECT_EQ(back.outputs, "[S(1), R]{1: 7,3}");
  EXPECT_EQ(back.moves, "none");
  // An index split where self is: both are gathered, as before.
  const Answer split = call_rule("aten::gather", {self, int64_t{1}, spec({2, 2}, {Shard(0), Replicate()}, {4, 6, 3}), false});
  EXPECT_EQ(split.targets, "[R, R] | [R, R]");
  EXPECT_EQ(split.outputs, "[R, R]");
  EXPECT_EQ(split.kernel, "");
  const Answer split_select = call_rule("aten::index_select", {self, int64_t{1}, spec({2, 2}, {Shard(0), Replicate()}, {6})});
  EXPECT_EQ(split_select.targets, "[R, R] | [R, R]");
  EXPECT_EQ(split_select.kernel, "");
  // self split along another dim as well: the indexed dim is gathered, the other stays split.
  const auto rows_too = spec({2, 2}, {Shard(1), Shard(0)}, {4, 10, 3});
  const Answer both = call_rule("aten::gather", {rows_too, int64_t{1}, index, false});
  EXPECT_EQ(both.targets, "[R, S(0)]{0: 2,2} | [R, S(0)]{0: 2,2}");
  EXPECT_EQ(both.outputs, "[R, S(0)]{0: 2,2}");
  EXPECT_EQ(both.kernel, "");
  const Answer both_select = call_rule("aten::index_select", {rows_too, int64_t{1}, spec({2, 2}, {Replicate(), Replicate()}, {5})});
  EXPECT_EQ(both_select.targets, "[R, S(0)]{0: 2,2} | [R, R]");
  EXPECT_EQ(both_select.kernel, "");
}

// ---- arguments by name ----

// OpMeta over aten::gather(self, dim, index, *, sparse_grad) with a sharded self and index.
struct GatherCall {
  c10::OperatorHandle handle = c10::Dispatcher::singleton().findSchemaOrThrow("aten::gather", "");
  std::vector<c10::IValue> values = {at::Tensor(), int64_t{1}, at::Tensor(), false};
  OpMeta meta;
  GatherCall() {
    meta.name = "aten::gather";
    meta.schema = &handle.schema();
    meta.inputs = {{spec({4}, {Shard(0)}, {8, 5}), 0, false}, {spec({4}, {Shard(0)}, {8, 2}), 2, false}};
    meta.args = values;
  }
};

TEST(OpMetaArgs, ArgumentsAreReadByTheirSchemaNames) {
  const GatherCall call;
  EXPECT_EQ(call.meta.arg_index("index"), 2u);
  EXPECT_EQ(call.meta.arg("dim").toInt(), 1);
  EXPECT_EQ(int_arg(call.meta, "dim"), 1);
  EXPECT_FALSE(bool_arg(call.meta, "sparse_grad"));
  ASSERT_NE(call.meta.input_named("index"), nullptr);
  EXPECT_EQ(call.meta.input_named("index")->spec.shape(), std::vector<int64_t>({8, 2}));
  EXPECT_EQ(call.meta.input_named("dim"), nullptr);  // not a tensor
  EXPECT_EQ(arg_name(call.meta, call.meta.inputs[1]), "index");
}

TEST(OpMetaArgs, AMissingNameNamesTheOperatorTheNameAndTheSchemasArguments) {
  const GatherCall call;
  for (const auto& read : std::vector<std::function<void()>>{[&] { call.meta.arg_index("axis"); },
                                                               [&] { call.meta.arg("axis"); },
                                                               [&] { call.meta.input_named("axis"); },
                                                               [&] { int_arg(call.meta, "axis"); }}) {
    try {
      read();
      ADD_FAILURE() << "reading a missing argument did not raise";
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      EXPECT_NE(what.find("aten::gather has no argument named 'axis'"), std::string::npos) << what;
      EXPECT_NE(what.find("(self, dim, index, sparse_grad)"), std::string::npos) << what;
    }
  }
}

// ---- attention ----

namespace {
// The CPU flash attention operator exists from torch 2.0; on 1.13 these tests skip.
bool have_flash_attention() {
  return c10::Dispatcher::singleton().findSchema({"aten::_scaled_dot_product_flash_attention_for_cpu", ""}).has_value();
}
#define SKIP_WITHOUT_FLASH_ATTENTION() \
  if (!have_flash_attention()) GTEST_SKIP() << "aten::_scaled_dot_product_flash_attention_for_cpu does not exist in this libtorch"

Answer attention(const ShardTensorSpec& q, const ShardTensorSpec& k, bool is_causal = false) {
  return call_rule("aten::_scaled_dot_product_flash_attention_for_cpu", {q, k, k, 0.0, is_causal, kNone, kNone});
}
}  // namespace

TEST(AttentionRules, SequenceShardsOfQueryKeysAndValuesMakeARing) {
  SKIP_WITHOUT_FLASH_ATTENTION();
  const auto q = spec({4}, {Shard(2)}, {2, 4, 12, 8}, {{2, {5, 0, 4, 3}}});
  const auto k = spec({4}, {Shard(2)}, {2, 2, 10, 8}, {{2, {1, 2, 3, 4}}});
  const Answer a = attention(q, k, /*is_causal=*/true);
  EXPECT_EQ(a.targets, "[S(2)]{2: 5,0,4,3} | [S(2)]{2: 1,2,3,4} | [S(2)]{2: 1,2,3,4}");  // each keeps its own split
  EXPECT_EQ(a.outputs, "[S(2)]{2: 5,0,4,3} | [S(2)]{2: 5,0,4,3}");
  EXPECT_EQ(a.moves, "RingPass(mesh_dim=0, tensor_dim=2, batches=3)");  // one per ring step that moves a block
  EXPECT_EQ(a.kernel, "ring attention over mesh dim 0, causal (forward)");
}

TEST(AttentionRules, BatchShardedQueryTakesTheKeysBatchShardsLocally) {
  SKIP_WITHOUT_FLASH_ATTENTION();
  const Answer a = attention(spec({4}, {Shard(0)}, {5, 4, 6, 8}), spec({4}, {Replicate()}, {5, 4, 6, 8}));
  EXPECT_EQ(a.targets, "[S(0)]{0: 2,2,1,0} | [S(0)]{0: 2,2,1,0} | [S(0)]{0: 2,2,1,0}");
  EXPECT_EQ(a.moves, "none");
  EXPECT_EQ(a.kernel, "local attention (forward)");
}

TEST(AttentionRules, AHeadSplitThatCutsAKeyGroupGathersTheHeads) {
  SKIP_WITHOUT_FLASH_ATTENTION();
  // 4 query heads over 2 key heads: groups of 2; shards of 1 head would split a group.
  const Answer cut = attention(spec({4}, {Shard(1)}, {1, 4, 6, 8}), spec({4}, {Shard(1)}, {1, 2, 6, 8}));
  EXPECT_EQ(cut.targets, "[R] | [R] | [R]");
  const Answer whole = attention(spec({2}, {Shard(1)}, {1, 4, 6, 8}), spec({2}, {Replicate()}, {1, 2, 6, 8}));
  EXPECT_EQ(whole.targets, "[S(1)]{1: 2,2} | [S(1)]{1: 1,1} | [S(1)]{1: 1,1}");
}

TEST(AttentionRules, RowsAgainstWholeKeysGiveSummedKeyGradients) {
  SKIP_WITHOUT_FLASH_ATTENTION();
  const auto rows = spec({2}, {Shard(2)}, {1, 2, 6, 4}, {{2, {4, 2}}});
  const auto keys = spec({2}, {Replicate()}, {1, 2, 9, 4});
  const auto lse = spec({2}, {Shard(2)}, {1, 2, 6}, {{2, {4, 2}}});
  const Answer a = call_rule("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                             {rows, rows, keys, keys, rows, lse, 0.0, true, kNone, kNone});
  EXPECT_EQ(a.outputs, "[S(2)]{2: 4,2} | [P(sum)] | [P(sum)]");
  EXPECT_EQ(a.moves, "none");
  EXPECT_EQ(a.kernel, "local attention, causal (backward)");
}

TEST(AttentionRules, WholeRowsAgainstSplitKeysGatherOnlyTheStatistics) {
  SKIP_WITHOUT_FLASH_ATTENTION();
  const auto q = spec({4}, {Replicate()}, {2, 4, 12, 8});
  const auto k = spec({4}, {Shard(2)}, {2, 2, 10, 8}, {{2, {1, 0, 6, 3}}});
  const Answer a = attention(q, k);
  EXPECT_EQ(a.targets, "[R] | [S(2)]{2: 1,0,6,3} | [S(2)]{2: 1,0,6,3}");  // no K/V byte moves
  EXPECT_EQ(a.outputs, "[P(sum)] | [R]");                                 // each rank's weighted share; merged lse
  EXPECT_EQ(a.moves, "StatisticsGather(mesh_dim=0)");
  EXPECT_EQ(a.kernel, "attention on split keys over mesh dim 0, merged by log-sum-exp (forward)");

  const auto lse = spec({4}, {Replicate()}, {2, 4, 12});
  const Answer back = call_rule("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                                {q, q, k, k, q, lse, 0.0, false, kNone, kNone});
  EXPECT_EQ(back.outputs, "[P(sum)] | [S(2)]{2: 1,0,6,3} | [S(2)]{2: 1,0,6,3}");
  EXPECT_EQ(back.moves, "none");
}

TEST(AttentionRules, AMaskNextToARingIsSplitByRowsAndWholeAlongTheKeys) {
  SKIP_WITHOUT_FLASH_ATTENTION();
  const auto q = spec({2}, {Shard(2)}, {1, 2, 6, 4}, {{2, {4, 2}}});
  const auto k = spec({2}, {Shard(2)}, {1, 2, 9, 4});
  const auto mask_split_by_keys = spec({2}, {Shard(1)}, {6, 9});
  const Answer a = call_rule("aten::_scaled_dot_product_flash_attention_for_cpu", {q, k, k, 0.0, false, mask_split_by_keys, kNone});
  EXPECT_EQ(a.targets, "[S(2)]{2: 4,2} | [S(2)]{2: 5,4} | [S(2)]{2: 5,4} | [S(0)]{0: 4,2}");
  EXPECT_EQ(a.kernel, "ring attention over mesh dim 0 (forward)");
}

TEST(AttentionRules, CausalRingScheduleMovesNoBlockAboveTheDiagonal) {
  AttentionPlan plan(DeviceMesh::without_comms({4}, 0));
  plan.ring = plan.is_causal = true;
  plan.seq_mesh_dim = 0;
  plan.query_rows = plan.key_rows = {{{0, 3}}, {{3, 6}}, {{6, 9}}, {{9, 12}}};
  // Block b is needed by ranks b..3: it moves after steps 0..2-b and stops on rank 3.
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t step = 0; step < 4; ++step) {
      EXPECT_EQ(plan.computes(b, step), b + step <= 3) << "block " << b << " step " << step;
      EXPECT_EQ(plan.sends(b, step), b + step < 3) << "block " << b << " step " << step;
    }
  EXPECT_EQ(plan.last_step(0), 3);
  EXPECT_EQ(plan.last_step(3), 0);
  // An offset diagonal: rows 4..7 against keys 2..9 see keys 2..6, through an explicit mask.
  const VisibleBlock v = visible_block({4, 8}, {2, 10}, /*is_causal=*/true);
  EXPECT_TRUE(v.any && v.offset_mask);
  EXPECT_EQ(v.rows, (Range{4, 8}));
  EXPECT_EQ(v.keys, (Range{2, 8}));
  EXPECT_FALSE(visible_block({0, 3}, {3, 6}, true).any);
  EXPECT_TRUE(visible_block({3, 6}, {3, 6}, true).top_left);
}

// Zigzag chunks balance a causal ring: every rank computes about the same share of the
// visible (row, key) pairs, where contiguous shards leave the last rank 2n - 1 times the first's.
TEST(AttentionRules, ZigzagChunksBalanceTheCausalWork) {
  const int64_t n = 4, length = 64;
  auto work = [&](const AttentionPlan& plan, int64_t rank) {
    int64_t pairs = 0;
    for (const Range& rows : plan.query_rows[rank])
      for (int64_t block = 0; block < n; ++block)
        for (const Range& keys : plan.key_rows[block])
          for (int64_t i = rows.begin; i < rows.end; ++i) pairs += std::max<int64_t>(0, std::min(keys.end, i + 1) - keys.begin);
    return pairs;
  };
  AttentionPlan contiguous(DeviceMesh::without_comms({n}, 0)), zigzag(DeviceMesh::without_comms({n}, 0));
  contiguous.ring = zigzag.ring = contiguous.is_causal = zigzag.is_causal = true;
  for (int64_t r = 0; r < n; ++r) {
    contiguous.query_rows.push_back({{r * length / n, (r + 1) * length / n}});
    zigzag.query_rows.push_back(zigzag_positions(length, n, r));
  }
  contiguous.key_rows = contiguous.query_rows;
  zigzag.key_rows = zigzag.query_rows;
  EXPECT_EQ(zigzag.query_rows[1], (Pieces{{8, 16}, {48, 56}}));
  EXPECT_EQ(work(contiguous, 0), 16 * 17 / 2);
  EXPECT_EQ(work(contiguous, n - 1), (49 + 64) * 16 / 2);  // 6.6 times rank 0's
  for (int64_t r = 0; r < n; ++r) EXPECT_EQ(work(zigzag, r), 520) << "rank " << r;  // chunks c and 7 - c: 64c + 36 each
  // Every block is needed on every rank (each holds a late chunk): it goes all the way round.
  for (int64_t b = 0; b < n; ++b) EXPECT_EQ(zigzag.last_step(b), n - 1);
}

// The causal ring reads zigzag chunks where the query's sequence is ZigzagShard: the order is
// the layout's, and keys in another order are put in the query's.
TEST(AttentionRules, ZigzagQueryMakesTheCausalRingReadChunks) {
  SKIP_WITHOUT_FLASH_ATTENTION();
  const auto zz = spec({4}, {ZigzagShard(2)}, {1, 2, 10, 8});
  const auto contiguous = spec({4}, {Shard(2)}, {1, 2, 10, 8});
  EXPECT_EQ(zigzag_shard_sizes(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));  // chunks 2,2,1,1,1,1,1,1
  EXPECT_EQ(zz.sharding_of(2)->sizes, zigzag_shard_sizes(10, 4));
  EXPECT_EQ(attention(zz, zz, /*is_causal=*/true).kernel, "ring attention over mesh dim 0, causal on zigzag chunks (forward)");
  EXPECT_EQ(attention(zz, zz, /*is_causal=*/false).kernel, "ring attention over mesh dim 0 (forward)");  // positions do not matter
  const Answer mixed = attention(zz, contiguous, /*is_causal=*/true);
  EXPECT_EQ(mixed.kernel, "ring attention over mesh dim 0, causal on zigzag chunks (forward)");
  EXPECT_EQ(mixed.targets, "[Z(2)]{2: 3,3,2,2} | [Z(2)]{2: 3,3,2,2} | [Z(2)]{2: 3,3,2,2}");
  EXPECT_EQ(attention(contiguous, zz, /*is_causal=*/true).kernel, "ring attention over mesh dim 0, causal (forward)");
}

// The CUDA operators take the same rule: flash's extra outputs (sequence offsets, random-number
// state, debug mask) and the efficient operator's (philox seed and offset) are each rank's own.
TEST(AttentionRules, CudaFlashRingKeepsItsOtherOutputsPerRank) {
  SKIP_WITHOUT_FLASH_ATTENTION();
  const auto q = spec({4}, {Shard(2)}, {2, 4, 12, 8}, {{2, {5, 0, 4, 3}}});
  const Answer a = call_rule("aten::_scaled_dot_product_flash_attention", {q, q, q, 0.0, true, false, kNone});
  EXPECT_EQ(a.outputs, "[S(2)]{2: 5,0,4,3} | [S(2)]{2: 5,0,4,3} | [R] | [R] | [R] | [R] | [R]");
  EXPECT_EQ(a.kernel, "ring attention over mesh dim 0, causal (forward)");

  const auto lse = spec({4}, {Shard(2)}, {2, 4, 12}, {{2, {5, 0, 4, 3}}}), state = spec({4}, {Replicate()}, {2});
  const Answer back = call_rule("aten::_scaled_dot_product_flash_attention_backward",
                                {q, q, q, q, q, lse, kNone, kNone, int64_t{12}, int64_t{12}, 0.0, true, state, state, kNone});
  EXPECT_EQ(back.targets, "[S(2)]{2: 5,0,4,3} | [S(2)]{2: 5,0,4,3} | [S(2)]{2: 5,0,4,3} | [S(2)]{2: 5,0,4,3} | "
                          "[S(2)]{2: 5,0,4,3} | [S(2)]{2: 5,0,4,3} | [R] | [R]");
  EXPECT_EQ(back.moves,
            "RingPass(mesh_dim=0, tensor_dim=2, batches=3); RingGradientPass(mesh_dim=0, tensor_dim=2, batches=3); "
            "RingReturn(mesh_dim=0, tensor_dim=2)");
}

// The flash operator's own causal mask is bottom-right where Sq != Sk (F.scaled_dot_product_attention
// never picks it then): called so, it falls back to the operator on the whole tensors.
TEST(AttentionRules, CudaFlashRefusesACausalMaskThatIsNotSquare) {
  SKIP_WITHOUT_FLASH_ATTENTION();
  const auto q = spec({2}, {Shard(2)}, {1, 2, 6, 8}), k = spec({2}, {Shard(2)}, {1, 2, 8, 8});
  const RuleResult r = apply_rule("aten::_scaled_dot_product_flash_attention", {q, k, k, 0.0, true, false, kNone});
  EXPECT_NE(r.unsupported_reason.find("bottom-right"), std::string::npos) << r.unsupported_reason;
  EXPECT_EQ(apply_rule("aten::_scaled_dot_product_flash_attention", {q, k, k, 0.0, false, false, kNone}).unsupported_reason, "");
}

TEST(AttentionRules, CudaEfficientBiasFollowsTheRowsAndItsGradientIsNotAskedFor) {
  SKIP_WITHOUT_FLASH_ATTENTION();
  const auto q = spec({2}, {Shard(2)}, {1, 2, 6, 8}, {{2, {4, 2}}});
  const auto bias = spec({2}, {Replicate()}, {1, 2, 6, 6});
  const Answer a = call_rule("aten::_scaled_dot_product_efficient_attention", {q, q, q, bias, true, 0.0, false, kNone});
  EXPECT_EQ(a.targets, "[S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [S(2)]{2: 4,2}");  // the bias split by rows
  EXPECT_EQ(a.outputs, "[S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [R] | [R]");

  const auto lse = spec({2}, {Shard(2)}, {1, 2, 6}, {{2, {4, 2}}}), seed = spec({2}, {Replicate()}, {});
  const Answer back = call_rule("aten::_scaled_dot_product_efficient_attention_backward",
                                {q, q, q, q, bias, q, lse, seed, seed, 0.0, c10::IValue(c10::List<bool>({true, true, true, false})),
                                 false, kNone});
  EXPECT_EQ(back.outputs, "[S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [R]");
  EXPECT_EQ(back.kernel, "ring attention over mesh dim 0 (backward)");
}

// cuDNN's operator: a log-sum-exp of [B, H, Sq, 1] laid out like the query's rows, its seed,
// offset and sequence offsets each rank's own; the backward reads that log-sum-exp by rows too.
// A causal mask with Sq != Sk is left to the operator on the whole tensors.
TEST(AttentionRules, CudnnRingReturnsItsFourDimLogSumExpByRows) {
  if (!c10::Dispatcher::singleton().findSchema({"aten::_scaled_dot_product_cudnn_attention", ""}))
    GTEST_SKIP() << "aten::_scaled_dot_product_cudnn_attention does not exist in this libtorch";
  const auto q = spec({2}, {Shard(2)}, {1, 2, 6, 8}, {{2, {4, 2}}});
  const Answer a = call_rule("aten::_scaled_dot_product_cudnn_attention", {q, q, q, kNone, true, 0.0, true, false, kNone});
  EXPECT_EQ(a.outputs, "[S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [R] | [R] | [R] | [R] | [R]");
  EXPECT_EQ(a.kernel, "ring attention over mesh dim 0, causal (forward)");

  const auto lse = spec({2}, {Shard(2)}, {1, 2, 6, 1}, {{2, {4, 2}}}), seed = spec({2}, {Replicate()}, {});
  const Answer back = call_rule("aten::_scaled_dot_product_cudnn_attention_backward",
                                {q, q, q, q, q, lse, seed, seed, kNone, kNone, kNone, int64_t{6}, int64_t{6}, 0.0, true, kNone});
  EXPECT_EQ(back.targets, "[S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [R] | [R]");
  EXPECT_EQ(back.outputs, "[S(2)]{2: 4,2} | [S(2)]{2: 4,2} | [S(2)]{2: 4,2}");

  const auto k = spec({2}, {Shard(2)}, {1, 2, 8, 8});
  const RuleResult refused = apply_rule("aten::_scaled_dot_product_cudnn_attention", {q, k, k, kNone, true, 0.0, true, false, kNone});
  EXPECT_NE(refused.unsupported_reason.find("cuDNN aligns"), std::string::npos) << refused.unsupported_reason;
}

// ---- every rule family is in this file ----

TEST(ScanRules, ScanAlongAnUnshardedDimMovesNothing) {
  const auto x = spec({4}, {Shard(0)}, {8, 6});
  const Answer a = call_rule("aten::cumsum", {x, int64_t{1}, kNone});
  EXPECT_EQ(a.targets, "[S(0)]{0: 2,2,2,2}");
  EXPECT_EQ(a.outputs, "[S(0)]{0: 2,2,2,2}");
  EXPECT_EQ(a.moves, "none");
}

TEST(ScanRules, SortAlongTheShardedDimGathersItFirst) {
  const Answer a = call_rule("aten::sort", {spec({4}, {Shard(1)}, {3, 6}), int64_t{-1}, false});
  EXPECT_EQ(a.targets, "[R]");
  EXPECT_EQ(a.outputs, "[R] | [R]");  // values and indices
}

TEST(ScanRules, HistogramWithARangeIsAPartialSumOfLocalCounts) {
  const Answer a = call_rule("aten::histc", {spec({4}, {Shard(0)}, {8, 6}), int64_t{5}, 0.0, 1.0});
  EXPECT_EQ(a.outputs, "[P(sum)]");
  EXPECT_EQ(a.moves, "none");
}

TEST(RuleFamilies, EveryFamilyHasATestHere) {
  // One registration function per family in rules/registry.h; keep this list in step with it.
  const std::vector<std::string> families = {"Pointwise", "Reduction", "Matmul", "View", "Normalization", "Loss", "Embedding",
                                             "Convolution", "Pooling", "Resampling", "SpatialNorm", "Random", "Indexing", "Attention", "Scan"};
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (const std::string& family : families) {
    bool found = false;
    for (int i = 0; i < unit.total_test_suite_count(); ++i)
      found = found || std::string(unit.GetTestSuite(i)->name()) == family + "Rules";
    EXPECT_TRUE(found) << "no " << family << "Rules test suite";
  }
}

// ---- register_sharding: DTensor's acceptable shardings as a rule ----

TEST(RegisterSharding, TakesTheCheapestAcceptableShardingOnEachMeshDim) {
  // i0e on any one dim or whole, as DTensor's register_sharding example writes softmax's.
  register_sharding("aten::special_i0e", [](const OpMeta& op) {
    std::vector<AcceptableSharding> ok{{{Replicate()}, {Replicate()}}};
    for (int64_t d = 0; d < op.inputs[0].spec.ndim(); ++d) ok.push_back({{Shard(d)}, {Shard(d)}});
    return ok;
  });
  auto i0e = [](const ShardTensorSpec& x) { return call_rule("aten::special_i0e", {x}); };
  const Answer kept = i0e(spec({4}, {Shard(1)}, {6, 9}));
  EXPECT_EQ(kept.targets, "[S(1)]{1: 3,3,3,0}");  // already acceptable: nothing moves
  EXPECT_EQ(kept.outputs, "[S(1)]{1: 3,3,3,0}");  // sizes of the input sharded alike
  // A pending sum must be resolved: a reduce-scatter to S(0) moves less than an all-reduce to R.
  EXPECT_EQ(i0e(spec({4}, {Partial()}, {8, 3})).targets, "[S(0)]{0: 2,2,2,2}");
  // Per mesh dim: [S(0), S(1)] on a 2 x 2 mesh is one acceptable sharding on each.
  EXPECT_EQ(i0e(spec({2, 2}, {Shard(0), Shard(1)}, {4, 5})).outputs, "[S(0), S(1)]{0: 2,2}{1: 3,2}");

  register_sharding("aten::special_i1e", [](const OpMeta&) {
    return std::vector<AcceptableSharding>{{{Shard(0)}, {Shard(0), Replicate()}}};  // two inputs for one
  });
  try {
    apply_rule("aten::special_i1e", {spec({4}, {Shard(0)}, {8})});
    ADD_FAILURE() << "a wrong count of input placements was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("one per tensor input (1 in this call)"), std::string::npos) << e.what();
  }
}
