// The direct kernels' typed cache lookup (dispatch/propagation_key.h) must compute the key
// propagate() computes from the boxed arguments, or every direct call would miss and rebuild
// its propagation; and its hit check must tell apart every pair of arguments the boxed check
// tells apart, or a call could run with another call's layouts.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dispatch/cached_propagation.h"

using namespace shardtensor;
using namespace shardtensor::propagation_key;

namespace {

// `value` hashes as its boxed form, equals it, and differs from `other`'s boxed form.
template <class T>
void expect_as_boxed(const T& value, const c10::IValue& boxed, const c10::IValue& other) {
  EXPECT_EQ(Argument<T>::hash(value), hash_argument(boxed)) << boxed;
  EXPECT_TRUE(Argument<T>::same(value, boxed)) << boxed;
  EXPECT_FALSE(Argument<T>::same(value, other)) << boxed << " against " << other;
}

TEST(PropagationKey, IntListsHashAndCompareAsBoxed) {
  const std::vector<int64_t> empty, sizes = {3, -1, 0}, longer = {3, -1, 0, 2};
  expect_as_boxed(c10::IntArrayRef(sizes), c10::IValue(c10::IntArrayRef(sizes)), c10::IValue(c10::IntArrayRef(longer)));
  expect_as_boxed(c10::IntArrayRef(empty), c10::IValue(c10::IntArrayRef(empty)), c10::IValue(c10::IntArrayRef(sizes)));
  expect_as_boxed(c10::IntArrayRef(sizes), c10::IValue(c10::IntArrayRef(sizes)), c10::IValue(std::vector<int64_t>{3, -1, 1}));
  // An int list is not None, nor an int.
  expect_as_boxed(c10::IntArrayRef(sizes), c10::IValue(c10::IntArrayRef(sizes)), c10::IValue());
  expect_as_boxed(c10::IntArrayRef(empty), c10::IValue(c10::IntArrayRef(empty)), c10::IValue(int64_t{0}));
}

TEST(PropagationKey, OptionalIntListsHashAndCompareAsBoxed) {
  const std::vector<int64_t> dims = {1};
  using Optional = c10::OptionalArrayRef<int64_t>;
  expect_as_boxed(Optional(dims), c10::IValue(Optional(dims)), c10::IValue());
  expect_as_boxed(Optional(), c10::IValue(Optional()), c10::IValue(Optional(dims)));
  expect_as_boxed(Optional(dims), c10::IValue(Optional(dims)), c10::IValue(std::vector<int64_t>{0}));
}

TEST(PropagationKey, SymIntListsHashAndCompareAsBoxed) {
  const std::vector<c10::SymInt> sizes = {c10::SymInt(4), c10::SymInt(2), c10::SymInt(2)};
  const c10::SymIntArrayRef ref(sizes);
  expect_as_boxed(ref, c10::IValue(ref), c10::IValue(std::vector<int64_t>{4, 4}));
  expect_as_boxed(ref, c10::IValue(ref), c10::IValue(std::vector<int64_t>{4, 2, 3}));
}

TEST(PropagationKey, StringsHashAndCompareAsBoxed) {
  for (const std::string& s : {std::string("none"), std::string("tanh"), std::string(),
                               std::string("a string longer than the small-string buffer")}) {
    const c10::string_view view(s.data(), s.size());
    expect_as_boxed(view, c10::IValue(s), c10::IValue(s + "x"));
    expect_as_boxed(view, c10::IValue(s), c10::IValue());
  }
}

TEST(PropagationKey, OtherArgumentsHashAndCompareAsBoxed) {
  expect_as_boxed(int64_t{3}, c10::IValue(int64_t{3}), c10::IValue(int64_t{4}));
  expect_as_boxed(true, c10::IValue(true), c10::IValue(false));
  expect_as_boxed(0.5, c10::IValue(0.5), c10::IValue(-0.5));
  expect_as_boxed(c10::Scalar(2), c10::IValue(c10::Scalar(2)), c10::IValue(c10::Scalar(2.0)));
  using Dtype = c10::optional<c10::ScalarType>;
  expect_as_boxed(Dtype(at::kFloat), c10::IValue(Dtype(at::kFloat)), c10::IValue(Dtype()));
  expect_as_boxed(Dtype(), c10::IValue(Dtype()), c10::IValue(Dtype(at::kDouble)));
}

TEST(PropagationKey, TensorsHashAsBoxed) {
  const at::Tensor t = at::zeros({2, 3});
  EXPECT_EQ(TypedCall::hash(t), hash_argument(c10::IValue(t)));
  EXPECT_EQ(TypedCall::hash(at::Tensor()), hash_argument(c10::IValue(at::Tensor())));
  EXPECT_EQ(TypedCall::hash(c10::optional<at::Tensor>()), hash_argument(c10::IValue()));
  EXPECT_EQ(TypedCall::hash(c10::optional<at::Tensor>(t)), hash_argument(c10::IValue(t)));
  EXPECT_NE(TypedCall::hash(t), TypedCall::hash(at::zeros({3, 2})));
}

}  // namespace
