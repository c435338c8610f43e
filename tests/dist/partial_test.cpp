// Partial placements kept where the math allows (#16 item 5), with the collectives counted, and
// the placement rules of in-place ops (#16 item 4). The oracle is one process: every rank
// builds the same global values, and each Partial operand holds this rank's term of its value
// (partial_term), so a reduction of the terms gives the value back exactly.
#include <ATen/ATen.h>

#include <functional>
#include <limits>

#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

at::Tensor same_randn(std::vector<int64_t> shape) {
  static uint64_t draws = 0;
  at::manual_seed(700 + draws++);
  return at::randn(shape, at::kDouble);
}

// `value` as a ShardTensor pending `op` over every mesh dim of the 1-D mesh.
at::Tensor pending(const at::Tensor& value, ReduceOp op = ReduceOp::Sum) {
  const Placements ps{Partial(op)};
  return from_local(partial_term(value, mesh_1d(), ps), mesh_1d(), ps);
}

at::Tensor replicate(const at::Tensor& value) { return from_local(value.clone(), mesh_1d(), {Replicate()}); }

// The reductions a world of `n` ranks runs for something that needs one: none alone.
int64_t one_if_several() { return mesh_1d().size(0) > 1 ? 1 : 0; }

void expect_value(const at::Tensor& t, const Placements& placements, const at::Tensor& expected, const std::string& what) {
  EXPECT_EQ(spec(t).placements(), placements) << what;
  EXPECT_TRUE(at::allclose(full_tensor(t), expected, 1e-10, 1e-12)) << what << "\n" << full_tensor(t) << "\n" << expected;
}

// Results computed while collectives are counted, checked after: full_tensor communicates.
class Results {
 public:
  void add(at::Tensor t, Placements placements, at::Tensor expected, std::string what) {
    rows_.push_back({std::move(t), std::move(placements), std::move(expected), std::move(what)});
  }
  ~Results() {
    for (const Row& r : rows_) expect_value(r.t, r.placements, r.expected, r.what);
  }

 private:
  struct Row {
    at::Tensor t;
    Placements placements;
    at::Tensor expected;
    std::string what;
  };
  std::vector<Row> rows_;
};

}  // namespace

TEST(KeepPartial, SumPlusReplicateStaysPendingAndCountsTheReplicateOnce) {
  const at::Tensor va = same_randn({5, 3}), vb = same_randn({5, 3}), vrow = same_randn({3});
  const at::Tensor a = pending(va), b = replicate(vb), row = replicate(vrow), b_pending = pending(vb);
  Results results;
  CommDebugMode comms;
  results.add(a + b, {Partial()}, va + vb, "P + R");
  results.add(b + a, {Partial()}, vb + va, "R + P");
  results.add(a - row, {Partial()}, va - vrow, "P - broadcast R");
  results.add(b - a, {Partial()}, vb - va, "R - P");
  results.add(at::rsub(a, b), {Partial()}, vb - va, "rsub(P, R)");
  results.add(a + 2.5, {Partial()}, va + 2.5, "P + scalar");
  results.add(at::add(a, b, 3), {Partial()}, va + 3 * vb, "P + alpha R");
  results.add(a + b_pending, {Partial()}, va + vb, "P + P");
  EXPECT_EQ(comms.count("all_reduce"), 0) << comms.table();
}

TEST(KeepPartial, IntegerSumsStayExact) {
  // No division by the group size: the replicated value is counted once, exactly.
  const int64_t n = mesh_1d().size(0), c = mesh_1d().coordinate()[0];
  const at::Tensor global = at::arange(12, at::kLong).view({3, 4});
  const at::Tensor term = c == 0 ? global - (n - 1) : at::ones_like(global);
  const at::Tensor a = from_local(term, mesh_1d(), {Partial()});
  const at::Tensor seven = from_local(at::full({4}, 7, at::kLong), mesh_1d(), {Replicate()});
  CommDebugMode comms;
  const at::Tensor sum = a + seven;
  EXPECT_EQ(comms.total(), 0);
  EXPECT_EQ(spec(sum).placements(), Placements{Partial()});
  EXPECT_TRUE(at::equal(full_tensor(sum), global + 7));
}

TEST(KeepPartial, AProductOfTwoPendingSumsMakesOneReduction) {
  const at::Tensor va = same_randn({4, 6}), vb = same_randn({4, 6}), vr = same_randn({6});
  const at::Tensor a = pending(va), b = pending(vb), r = replicate(vr), fresh_b = pending(vb);
  {
    Results results;
    CommDebugMode comms;
    const at::Tensor product = a * b;
    EXPECT_EQ(comms.count("all_reduce"), one_if_several()) << comms.table();
    EXPECT_EQ(comms.total(), one_if_several());
    results.add(product, {Partial()}, va * vb, "P * P");
  }
  {
    Results results;
    CommDebugMode comms;
    results.add(a * r, {Partial()}, va * vr, "P * R");
    EXPECT_EQ(comms.total(), 0);
  }
  {
    Results results;
    CommDebugMode comms;
    const at::Tensor quotient = a / (fresh_b.abs() + 1);  // abs resolves b: one reduction, the rest local
    EXPECT_EQ(comms.count("all_reduce"), one_if_several()) << comms.table();
    results.add(quotient, {Partial()}, va / (vb.abs() + 1), "P / R");
  }
}

TEST(KeepPartial, AveragesThroughLinearOpsAndScaling) {
  const at::Tensor va = same_randn({3, 5}), vb = same_randn({3, 5}), vr = same_randn({3, 5});
  const at::Tensor a = pending(va, ReduceOp::Avg), b = pending(vb, ReduceOp::Avg), r = replicate(vr);
  Results results;
  CommDebugMode comms;
  const at::Tensor out = (a * 3 - b / 2).neg() + r;
  results.add(out, {Partial(ReduceOp::Avg)}, (va * 3 - vb / 2).neg() + vr, "linear ops on P(avg)");
  results.add(a * r, {Partial(ReduceOp::Avg)}, va * vr, "P(avg) * R");
  results.add(a.sum(0), {Partial(ReduceOp::Avg)}, va.sum(0), "sum of P(avg)");
  results.add(a.mean(), {Partial(ReduceOp::Avg)}, va.mean(), "mean of P(avg)");
  EXPECT_EQ(comms.count("all_reduce"), 0) << comms.table();
}

TEST(KeepPartial, MaxAndMinOfPendingMaximaAndMinima) {
  const at::Tensor va = same_randn({4, 5}), vb = same_randn({4, 5}), vr = same_randn({5});
  const at::Tensor hi = pending(va, ReduceOp::Max), hi2 = pending(vb, ReduceOp::Max);
  const at::Tensor lo = pending(va, ReduceOp::Min), lo2 = pending(vb, ReduceOp::Min), r = replicate(vr);
  const Placements pmax{Partial(ReduceOp::Max)}, pmin{Partial(ReduceOp::Min)};
  Results results;
  CommDebugMode comms;
  results.add(at::maximum(hi, hi2), pmax, at::maximum(va, vb), "maximum(P(max), P(max))");
  results.add(at::maximum(hi, r), pmax, at::maximum(va, vr), "maximum(P(max), R)");
  results.add(at::minimum(lo, lo2), pmin, at::minimum(va, vb), "minimum(P(min), P(min))");
  results.add(at::minimum(r, lo), pmin, at::minimum(vr, va), "minimum(R, P(min))");
  results.add(at::maximum(lo, r), pmin, at::maximum(va, vr), "maximum(P(min), R)");
  results.add(at::relu(hi), pmax, at::relu(va), "relu(P(max))");
  results.add(at::clamp(lo, -0.5, 0.5), pmin, at::clamp(va, -0.5, 0.5), "clamp(P(min))");
  results.add(hi + r, pmax, va + vr, "P(max) + R");
  results.add(at::amax(hi, {1}), pmax, at::amax(va, {1}), "amax of P(max)");
  results.add(hi.max(), pmax, va.max(), "max of P(max)");
  results.add(at::amin(lo, {0}), pmin, at::amin(va, {0}), "amin of P(min)");
  EXPECT_EQ(comms.total(), 0) << comms.table();
  {
    Results results;
    CommDebugMode resolved;  // maximum of pending minima is not a pending anything: one operand resolves
    results.add(at::maximum(lo, lo2), pmin, at::maximum(va, vb), "maximum(P(min), P(min))");
    EXPECT_EQ(resolved.count("all_reduce"), one_if_several());
  }
}

TEST(KeepPartial, ProductsOfAPendingAverageAndAReplicateStayPending) {
  // A product is linear in each operand: mean_i(A_i) @ B == mean_i(A_i @ B).
  const at::Tensor va = same_randn({4, 6}), vb = same_randn({6, 5}), vbias = same_randn({5}), vv = same_randn({6});
  const at::Tensor vba = same_randn({2, 4, 6}), vbb = same_randn({2, 6, 5}), vw = same_randn({5, 6});
  const Placements pavg{Partial(ReduceOp::Avg)};
  const at::Tensor a = pending(va, ReduceOp::Avg), b = replicate(vb), bias = replicate(vbias);
  const at::Tensor ra = replicate(va), b_pending = pending(vb, ReduceOp::Avg), v = replicate(vv), w = replicate(vw);
  const at::Tensor ba = pending(vba, ReduceOp::Avg), bb = replicate(vbb), hi = pending(va, ReduceOp::Max);
  Results results;
  CommDebugMode comms;
  results.add(at::mm(a, b), pavg, va.mm(vb), "mm(P(avg), R)");
  results.add(at::mm(ra, b_pending), pavg, va.mm(vb), "mm(R, P(avg))");
  results.add(at::mv(a, v), pavg, va.mv(vv), "mv(P(avg), R)");
  results.add(at::bmm(ba, bb), pavg, vba.bmm(vbb), "bmm(P(avg), R)");
  // Every term adds the bias: an average of (bias + term) is bias + the average.
  results.add(at::addmm(bias, a, b), pavg, at::addmm(vbias, va, vb), "addmm(R, P(avg), R)");
  results.add(at::addmm(bias, a, b, 0.5, 2), pavg, at::addmm(vbias, va, vb, 0.5, 2), "addmm with beta and alpha");
  results.add(at::linear(a, w, bias), pavg, at::linear(va, vw, vbias), "linear(P(avg), R, R)");
  EXPECT_EQ(comms.total(), 0) << comms.table();
  {
    CommDebugMode resolved;  // not linear in the pair: one operand is resolved
    const at::Tensor p = at::mm(a, b_pending);
    EXPECT_EQ(resolved.count("all_reduce"), one_if_several()) << resolved.table();
    EXPECT_TRUE(at::allclose(full_tensor(p), va.mm(vb)));
  }
  {
    Results results;
    CommDebugMode resolved;  // a pending maximum does not distribute over a product
    results.add(at::mm(hi, b), {Replicate()}, va.mm(vb), "mm(P(max), R)");
    EXPECT_EQ(resolved.count("all_reduce"), one_if_several());
  }
}

TEST(KeepPartial, ReducingPendingMaximaAlongDimsStaysPendingButMaxDimResolves) {
  const at::Tensor va = same_randn({4, 5, 3});
  const at::Tensor hi = pending(va, ReduceOp::Max), lo = pending(va, ReduceOp::Min);
  const Placements pmax{Partial(ReduceOp::Max)}, pmin{Partial(ReduceOp::Min)};
  {
    Results results;
    CommDebugMode comms;  // max over a dim of the ranks' maximum == the ranks' maximum of maxima over the dim
    results.add(at::amax(hi, {0, 2}, true), pmax, at::amax(va, {0, 2}, true), "amax keepdim of P(max)");
    results.add(at::amin(lo, {1}, false), pmin, at::amin(va, {1}), "amin of P(min)");
    results.add(lo.min(), pmin, va.min(), "min of P(min)");
    EXPECT_EQ(comms.total(), 0) << comms.table();
  }
  // max.dim also returns indices, which the ranks' terms disagree on: resolved first.
  CommDebugMode comms;
  const auto [values, indices] = at::max(hi, 1);
  EXPECT_EQ(comms.count("all_reduce"), one_if_several()) << comms.table();
  const auto [want_values, want_indices] = at::max(va, 1);
  expect_value(values, {Replicate()}, want_values, "max.dim values of P(max)");
  EXPECT_TRUE(at::equal(full_tensor(indices), want_indices));
}

TEST(KeepPartial, JoiningPendingValuesWithReplicatesKeepsThemPending) {
  const at::Tensor va = same_randn({4, 5}), vr = same_randn({4, 5});
  const at::Tensor a = pending(va), r = replicate(vr), product = pending(va, ReduceOp::Product);
  const at::Tensor kinds[] = {pending(va, ReduceOp::Avg), pending(va, ReduceOp::Max), pending(va, ReduceOp::Min)};
  const bool first = mesh_1d().coordinate()[0] == 0;
  Results results;
  CommDebugMode comms;
  const at::Tensor joined = at::cat({a, r}, 0);
  results.add(joined, {Partial()}, at::cat({va, vr}, 0), "cat(P(sum), R)");
  results.add(at::cat({r, a}, 1), {Partial()}, at::cat({vr, va}, 1), "cat(R, P(sum))");
  results.add(at::stack({a, r}, 0), {Partial()}, at::stack({va, vr}, 0), "stack(P(sum), R)");
  results.add(at::stack({r, a, r}, 2), {Partial()}, at::stack({vr, va, vr}, 2), "stack(R, P(sum), R)");
  // Every term holds the Replicate operand: already a pending average, maximum or minimum of it.
  for (const at::Tensor& p : kinds) {
    const ReduceOp op = spec(p).placements()[0].reduce_op;
    results.add(at::cat({p, r}, 1), {Partial(op)}, at::cat({va, vr}, 1), "cat(P, R) " + std::string(to_string(op)));
    results.add(at::stack({r, p}, 0), {Partial(op)}, at::stack({vr, va}, 0), "stack(R, P) " + std::string(to_string(op)));
  }
  EXPECT_EQ(comms.total(), 0) << comms.table();
  // Counted once: coordinate 0 holds the Replicate operand, the other terms zeros.
  EXPECT_TRUE(at::equal(to_local(joined).slice(0, 4, 8), first ? vr : at::zeros_like(vr)));
  {
    Results results;
    CommDebugMode resolved;  // every term would multiply a Replicate operand in: resolved
    results.add(at::cat({product, r}, 0), {Replicate()}, at::cat({va, vr}, 0), "cat(P(product), R)");
    EXPECT_EQ(resolved.count("all_reduce"), one_if_several());
  }
}

TEST(KeepPartial, GradientsThroughAJoinedReplicateMatchOneProcess) {
  const at::Tensor va = same_randn({3, 4}), vb = same_randn({2, 4}), vw = same_randn({5, 4});
  const at::Tensor a = pending(va), w = replicate(vw);
  const at::Tensor b = distribute_tensor(vb.clone().requires_grad_(true), mesh_1d(), {Replicate()});
  const at::Tensor loss = (at::cat({a, b}, 0) * w).sum();
  EXPECT_TRUE(at::allclose(full_tensor(loss), (at::cat({va, vb}, 0) * vw).sum()));
  loss.backward();
  ASSERT_TRUE(b.grad().defined());
  EXPECT_TRUE(at::allclose(full_tensor(b.grad()), vw.slice(0, 3, 5))) << full_tensor(b.grad());
}

TEST(KeepPartial, PaddingStackingAndIndexingMoveNoPendingValue) {
  const at::Tensor va = same_randn({4, 5}), vb = same_randn({4, 5}), vv = same_randn({3, 5});
  const at::Tensor a = pending(va), b = pending(vb), values = replicate(vv);
  const at::Tensor index = at::tensor(std::vector<int64_t>{3, 0, 3}, at::kLong);
  const at::Tensor gather_index = at::tensor(std::vector<int64_t>{4, 0, 1, 1, 2, 3, 0, 4}, at::kLong).view({4, 2});
  const at::Tensor idx = from_local(index, mesh_1d(), {Replicate()});
  const at::Tensor gidx = from_local(gather_index, mesh_1d(), {Replicate()});
  const at::Tensor hi = pending(va, ReduceOp::Max);
  Results results;
  CommDebugMode comms;
  results.add(at::constant_pad_nd(a, {1, 2}, 0), {Partial()}, at::constant_pad_nd(va, {1, 2}, 0), "pad P(sum) with 0");
  results.add(at::constant_pad_nd(hi, {1, 1, 2, 0}, 5), {Partial(ReduceOp::Max)}, at::constant_pad_nd(va, {1, 1, 2, 0}, 5),
               "pad P(max) with 5");
  results.add(at::cat({a, b}, 1), {Partial()}, at::cat({va, vb}, 1), "cat of P(sum)");
  results.add(at::stack({a, b}, 0), {Partial()}, at::stack({va, vb}, 0), "stack of P(sum)");
  results.add(at::gather(a, 1, gidx), {Partial()}, at::gather(va, 1, gather_index), "gather on P(sum)");
  using Indices = c10::List<c10::optional<at::Tensor>>;
  results.add(at::index(a, Indices({idx})), {Partial()}, at::index(va, Indices({index})), "index on P(sum)");
  results.add(at::index_put(a, Indices({idx.slice(0, 0, 2)}), values.slice(0, 0, 2), false), {Partial()},
               at::index_put(va, Indices({index.slice(0, 0, 2)}), vv.slice(0, 0, 2), false), "index_put of R values into P(sum)");
  results.add(at::index_put(a, Indices({idx}), values, /*accumulate=*/true), {Partial()},
               at::index_put(va, Indices({index}), vv, true), "index_put accumulating R values into P(sum)");
  EXPECT_EQ(comms.total(), 0) << comms.table();
  {
    Results results;
    CommDebugMode resolved;  // a sum padded with 1 is not a pending sum of padded terms
    results.add(at::constant_pad_nd(a, {1, 0}, 1), {Replicate()}, at::constant_pad_nd(va, {1, 0}, 1), "pad P(sum) with 1");
    EXPECT_EQ(resolved.count("all_reduce"), one_if_several());
  }
}

TEST(KeepPartial, SelectingAndOverwritingKeepEveryKind) {
  const at::Tensor va = same_randn({4, 3}), vb = same_randn({4, 3}), vr = same_randn({4, 3});
  const at::Tensor mask_value = va > 0;
  const at::Tensor mask = from_local(mask_value, mesh_1d(), {Replicate()});
  Results results;
  CommDebugMode comms;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    const at::Tensor a = pending(va, op), b = pending(vb, op), r = replicate(vr);
    const std::string kind = to_string(op);
    results.add(at::where(mask, a, b), {Partial(op)}, at::where(mask_value, va, vb), ("where(P, P) " + kind));
    results.add(at::where(mask, a, r), {Partial(op)}, at::where(mask_value, va, vr), ("where(P, R) " + kind));
    results.add(a.masked_fill(mask, 2.0), {Partial(op)}, va.masked_fill(mask_value, 2.0), ("masked_fill " + kind));
  }
  EXPECT_EQ(comms.count("all_reduce"), 0) << comms.table();
}

TEST(InPlacePlacement, CopyIntoAPartialKeepsItPendingWithTheRightLocalValues) {
  const at::Tensor va = same_randn({3, 4}), vs = same_randn({3, 4}), vp = same_randn({3, 4});
  const bool first = mesh_1d().coordinate()[0] == 0;
  at::Tensor x = pending(va);
  at::Tensor row = x.select(0, 1);  // a view: must see the same values as its base
  const at::Tensor src = replicate(vs), src_pending = pending(vp);
  {
    CommDebugMode comms;
    x.copy_(src);
    EXPECT_EQ(comms.total(), 0) << comms.table();
  }
  expect_value(x, {Partial()}, vs, "copy_ of R into P(sum)");
  expect_value(row, {Partial()}, vs.select(0, 1), "the view after copy_");
  // The contribution rule: coordinate 0 holds the value, the other terms are zero.
  EXPECT_TRUE(at::equal(to_local(x), first ? vs : at::zeros_like(vs)));
  x.copy_(src_pending);
  expect_value(x, {Partial()}, vp, "copy_ of P(sum) into P(sum)");
  EXPECT_TRUE(at::equal(to_local(x), to_local(src_pending)));
  x.fill_(3.0);
  expect_value(x, {Partial()}, at::full_like(va, 3.0), "fill_ of P(sum)");
  at::Tensor hi = pending(va, ReduceOp::Max);
  hi.copy_(src);
  expect_value(hi, {Partial(ReduceOp::Max)}, vs, "copy_ of R into P(max)");
  EXPECT_TRUE(at::equal(to_local(hi), vs));
  {
    CommDebugMode comms;
    x.zero_();
    EXPECT_EQ(comms.total(), 0);
  }
  expect_value(x, {Partial()}, at::zeros_like(va), "zero_ of P(sum)");
}

TEST(InPlacePlacement, AnInPlaceOpAPartialCannotKeepReducesItAndItsViewsAgree) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    const at::Tensor va = same_randn({4, 3});
    at::Tensor x = pending(va, op);
    at::Tensor column = x.select(1, 2);
    x.sin_();  // not distributive over any reduction: resolved, computed, and made pending again
    expect_value(x, {Partial(op)}, va.sin(), ("sin_ of P " + std::string(to_string(op))).c_str());
    expect_value(column, {Partial(op)}, va.sin().select(1, 2), "its view");
    column.mul_(2);  // in place through the view, kept pending
    expect_value(x, {Partial(op)}, at::cat({va.sin().slice(1, 0, 2), va.sin().slice(1, 2, 3) * 2}, 1), "base after the view's mul_");
  }
}

TEST(InPlacePlacement, OperatorsNeverChangeTheirInputsPlacement) {
  const at::Tensor va = same_randn({6, 2}), vr = same_randn({6, 2});
  const at::Tensor x = pending(va), r = replicate(vr);
  {
    Results results;
    CommDebugMode comms;
    const at::Tensor e = x.exp();  // needs the sum: one reduction
    EXPECT_EQ(comms.count("all_reduce"), one_if_several());
    results.add(e, {Replicate()}, va.exp(), "exp of P(sum)");
  }
  EXPECT_EQ(spec(x).placements(), Placements{Partial()});
  {
    Results results;
    CommDebugMode comms;  // the input is unchanged, so its resolved form is reused
    // cos and sigmoid read the resolved form; x * R and R + P(sum) stay pending
    results.add(x.cos() + x * x.sigmoid(), {Partial()}, va.cos() + va * va.sigmoid(), "more reads of P(sum)");
    EXPECT_EQ(comms.total(), 0) << comms.table();
  }
  r.add_(x);  // a Replicate self keeps Replicate
  EXPECT_EQ(spec(r).placements(), Placements{Replicate()});
  EXPECT_TRUE(at::allclose(full_tensor(r), vr + va));
  at::Tensor y = x.clone();
  expect_value(y.exp(), {Replicate()}, va.exp(), "exp of a clone");
  y.add_(1.0);  // changes y's terms: its resolved form must not be reused
  expect_value(y.exp(), {Replicate()}, (va + 1).exp(), "exp after add_");
  expect_value(x, {Partial()}, va, "the input of clone and exp");
  at::Tensor z = x.clone();
  expect_value(z.exp(), {Replicate()}, va.exp(), "exp of another clone");
  z.select(0, 1).mul_(2);  // written through a view
  expect_value(z.exp(), {Replicate()}, at::cat({va.slice(0, 0, 1), va.slice(0, 1, 2) * 2, va.slice(0, 2)}).exp(),
               "exp after a write through a view");
}

TEST(KeepPartial, GradientsThroughKeptPartialsMatchOneProcess) {
  const at::Tensor va = same_randn({5, 3}), vb = same_randn({3}), vw = same_randn({5, 3});
  const at::Tensor a = pending(va);
  const at::Tensor b = distribute_tensor(vb.clone().requires_grad_(true), mesh_1d(), {Replicate()});
  const at::Tensor w = replicate(vw);
  const at::Tensor loss = ((a + b) * w).sum();
  EXPECT_TRUE(at::allclose(full_tensor(loss), ((va + vb) * vw).sum()));
  loss.backward();
  ASSERT_TRUE(b.grad().defined());
  EXPECT_TRUE(at::allclose(full_tensor(b.grad()), vw.sum(0))) << full_tensor(b.grad());
}

TEST(KeepPartial, ComplexSumsAndAveragesReduceOnEveryTransport) {
  // Gloo reduces no complex type: the real view travels (#16 item 8).
  const at::Tensor value = at::complex(same_randn({6, 4}), same_randn({6, 4}));
  for (auto kind : {UseTransport::kMemory, UseTransport::kMessages, UseTransport::kCollectives}) {
    UseTransport transport(kind);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      const Placements ps{Partial(op)};
      const at::Tensor x = from_local(partial_term(value, mesh_1d(), ps), mesh_1d(), ps);
      EXPECT_TRUE(at::allclose(full_tensor(x), value)) << "transport " << kind << ", " << to_string(op);
      EXPECT_TRUE(at::allclose(full_tensor(redistribute(x, {Shard(0)})), value)) << "reduce-scatter, transport " << kind;
    }
    const Placements pmax{Partial(ReduceOp::Max)};
    const at::Tensor hi = from_local(value.clone(), mesh_1d(), pmax);
    if (mesh_1d().size(0) > 1) EXPECT_THROW(full_tensor(hi), c10::Error) << "a complex maximum has no meaning";
  }
}

namespace {

// 10 vocabulary rows over `pieces` shards, unevenly, piece 1 empty where there are several
// (so an offset follows an empty piece): 4 pieces give {4, 0, 3, 3}.
std::vector<int64_t> vocab_rows(int64_t pieces) {
  if (pieces == 1) return {10};
  std::vector<int64_t> sizes(pieces, 0);
  const int64_t filled = pieces - 1;
  for (int64_t j = 0, piece = 0; piece < pieces; ++piece) {
    if (piece == 1) continue;
    sizes[piece] = 10 / filled + (j < 10 % filled ? 1 : 0);
    ++j;
  }
  return sizes;
}

}  // namespace

// DTensor's MaskPartial: a table split by vocabulary rows is looked up where it lies, each rank
// answering the indices in its rows, into a Partial(sum); the indices may be split on other
// mesh dims. The table's gradient comes back in its rows, equal to one process's.
TEST(KeepPartial, AVocabShardedEmbeddingLooksUpLocallyIntoAPendingSum) {
  const at::Tensor table = same_randn({10, 4}), cotangent = same_randn({2, 3, 4});
  const at::Tensor ids = at::tensor(std::vector<int64_t>{9, 0, 4, 7, 2, 5}, at::kLong).view({2, 3});
  for (const DeviceMesh& mesh : test_meshes()) {
    const int64_t n = mesh.ndim();
    struct Layout {
      Placements table, ids;
    };
    std::vector<Layout> layouts = {{Placements(n, Shard(0)), Placements(n, Replicate())}};  // rows over every mesh dim
    if (n > 1) {  // rows over the last mesh dim, the indices' rows over the first
      Layout split{Placements(n, Replicate()), Placements(n, Replicate())};
      split.table[n - 1] = Shard(0);
      split.ids[0] = Shard(0);
      layouts.push_back(split);
    }
    for (const Layout& layout : layouts) {
      int64_t pieces = 1;
      Placements expected_placements = layout.ids;
      for (int64_t m = 0; m < n; ++m) {
        if (!layout.table[m].is_shard()) continue;
        pieces *= mesh.size(m);
        expected_placements[m] = Partial();
      }
      const std::vector<std::pair<int64_t, bool>> options = {{-1, false}, {4, true}};  // (padding_idx, scale_grad_by_freq)
      for (const auto& [padding_idx, by_frequency] : options) {
        const std::string what = mesh.to_string() + " table " + to_string(layout.table) + " indices " + to_string(layout.ids) +
                                 " padding_idx " + std::to_string(padding_idx);
        const at::Tensor w = distribute_tensor(table.clone().requires_grad_(true), mesh, layout.table, ShardSizes{{0, vocab_rows(pieces)}});
        const at::Tensor idx = distribute_tensor(ids, mesh, layout.ids);
        const at::Tensor cot = distribute_tensor(cotangent, mesh, Placements(n, Replicate()));
        at::Tensor out;
        {
          CommDebugMode comms;
          out = at::embedding(w, idx, padding_idx, by_frequency, /*sparse=*/false);
          EXPECT_EQ(comms.total(), 0) << what << "\n" << comms.table();
        }
        expect_value(out, expected_placements, at::embedding(table, ids), what);
        (out * cot).sum().backward();
        const at::Tensor reference = table.clone().requires_grad_(true);
        (at::embedding(reference, ids, padding_idx, by_frequency, false) * cotangent).sum().backward();
        ASSERT_TRUE(w.grad().defined()) << what;
        // In the table's rows where it is split (elsewhere a sum over split indices may stay
        // pending, as for any Replicate leaf: dispatch/relayout.h).
        for (int64_t m = 0; m < n; ++m)
          if (layout.table[m].is_shard()) EXPECT_EQ(spec(w.grad()).placements()[m], Shard(0)) << what << ", mesh dim " << m;
        EXPECT_EQ(spec(w.grad()).shard_sizes(), spec(w).shard_sizes()) << what;
        EXPECT_TRUE(at::allclose(full_tensor(w.grad()), reference.grad())) << what << "\n" << full_tensor(w.grad());
      }
    }
  }
}

// The same for gather and index_select along a split dim (of a 3-d self, so that index_select's
// mask broadcasts along a middle dim): each rank answers the entries in its own range into a
// Partial(sum), with no communication, and self's gradient comes back in its pieces, equal to
// one process's. With an inf at position 0 of every piece, which every other rank's masked
// entries read locally, the values still equal one process's (no 0 * inf = NaN).
TEST(KeepPartial, GatherAndIndexSelectAlongASplitDimLookUpLocallyIntoAPendingSum) {
  const int64_t dim = 1;
  const at::Tensor values = same_randn({2, 10, 3});
  struct Lookup {
    std::string name;
    at::Tensor ids;  // global positions along `dim`, touching every piece
    std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> call;
  };
  const std::vector<Lookup> lookups = {
      {"gather",
       at::tensor(std::vector<int64_t>{9, 0, 4, 7, 2, 5, 3, 8, 1, 6, 4, 0, 9, 9, 2, 7, 5, 1, 0, 3}, at::kLong).view({2, 5, 2}),
       [](const at::Tensor& self, const at::Tensor& index) { return at::gather(self, 1, index); }},
      {"index_select", at::tensor(std::vector<int64_t>{9, 0, 4, 7, 2, 5, 4}, at::kLong),
       [](const at::Tensor& self, const at::Tensor& index) { return at::index_select(self, -2, index); }},
  };
  for (const DeviceMesh& mesh : test_meshes()) {
    const int64_t n = mesh.ndim();
    std::vector<Placements> layouts = {Placements(n, Shard(dim))};  // the dim over every mesh dim
    if (n > 1) {  // over the last mesh dim only
      Placements last(n, Replicate());
      last[n - 1] = Shard(dim);
      layouts.push_back(last);
    }
    for (const Placements& layout : layouts) {
      int64_t pieces = 1;
      Placements expected_placements(n, Replicate());
      for (int64_t m = 0; m < n; ++m) {
        if (!layout[m].is_shard()) continue;
        pieces *= mesh.size(m);
        expected_placements[m] = Partial();
      }
      const ShardSizes sizes{{dim, vocab_rows(pieces)}};
      at::Tensor with_inf = values.clone();
      int64_t offset = 0;
      for (int64_t size : vocab_rows(pieces)) {
        if (size > 0) with_inf.select(dim, offset).fill_(std::numeric_limits<double>::infinity());
        offset += size;
      }
      for (const Lookup& lookup : lookups) {
        const std::string what = lookup.name + " on " + mesh.to_string() + " self " + to_string(layout);
        const at::Tensor expected = lookup.call(values, lookup.ids);
        const at::Tensor cotangent = same_randn(expected.sizes().vec());
        const at::Tensor self = distribute_tensor(values.clone().requires_grad_(true), mesh, layout, sizes);
        const at::Tensor self_with_inf = distribute_tensor(with_inf, mesh, layout, sizes);
        const at::Tensor idx = distribute_tensor(lookup.ids, mesh, Placements(n, Replicate()));
        const at::Tensor cot = distribute_tensor(cotangent, mesh, Placements(n, Replicate()));
        at::Tensor out, out_with_inf;
        {
          CommDebugMode comms;
          out = lookup.call(self, idx);
          out_with_inf = lookup.call(self_with_inf, idx);
          EXPECT_EQ(comms.total(), 0) << what << "\n" << comms.table();
        }
        expect_value(out, expected_placements, expected, what);
        expect_value(out_with_inf, expected_placements, lookup.call(with_inf, lookup.ids), what + ", an inf at every piece's position 0");
        (out * cot).sum().backward();
        const at::Tensor reference = values.clone().requires_grad_(true);
        (lookup.call(reference, lookup.ids) * cotangent).sum().backward();
        ASSERT_TRUE(self.grad().defined()) << what;
        EXPECT_EQ(spec(self.grad()).placements(), layout) << what;
        EXPECT_EQ(spec(self.grad()).shard_sizes(), spec(self).shard_sizes()) << what;
        EXPECT_TRUE(at::allclose(full_tensor(self.grad()), reference.grad())) << what << "\n" << full_tensor(self.grad());
      }
    }
  }
}
