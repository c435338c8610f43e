// The propagation cache's key and hit check, for arguments that are not yet boxed.
//
// propagate() takes the call's arguments as IValues. A direct kernel (direct_kernel.h) has
// them unboxed, and boxing a size list (view, expand, sum's dims) or a string (gelu's
// approximate) allocates, only to be hashed, compared and freed again. So the direct kernels
// look their propagation up here first, from the typed arguments: the key is computed exactly
// as propagate() computes it from the boxed ones (same hash for the same argument, checked by
// tests/unit/propagation_key_test.cpp), and a hit compares every argument with the ones the
// propagation was built for, as propagate() does. A miss boxes the arguments and goes to
// propagate(), which builds and caches the entry this lookup finds next time. The lookup
// itself is cached_propagation.h; this file is the key, which propagate() computes too.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/OptionalArrayRef.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "shardtensor/spec.h"

namespace c10 {
struct FunctionSchema;
}

namespace shardtensor {
namespace propagation_key {

inline uint64_t mix(uint64_t h, uint64_t v) {
  v += 0x9e3779b97f4a7c15ULL + h;
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
  return v ^ (v >> 31);
}

// The pieces propagate() uses (propagation.cpp).
uint64_t hash_tensor(const at::Tensor& t);            // its spec (a ShardTensor) or dtype and shape
uint64_t hash_argument(const c10::IValue& v);         // tensors as hash_tensor
bool same_argument(const c10::IValue& a, const c10::IValue& b);
bool same_input_spec(const at::Tensor& t, const ShardTensorSpec& built_for);
uint64_t seed(const c10::FunctionSchema& schema);     // the operator and the dispatch modes

// The first word mixed into each kind of argument's hash, so that kinds never collide.
inline constexpr uint64_t kNoneHash = 1, kIntTag = 2, kBoolTag = 3, kDoubleTag = 4, kUndefinedTensorHash = 5,
                          kShardTensorTag = 6, kPlainTensorTag = 7, kStringTag = 8, kDeviceTag = 9, kListSeed = 10,
                          kOtherTag = 11, kOutArgumentHash = 12;

// A non-tensor argument, as its boxed IValue hashes and compares. The general case boxes it
// (cheap for numbers, scalars and dtypes, which allocate nothing); lists and strings, which
// would allocate, have their own below.
template <class T>
struct Argument {
  static uint64_t hash(const T& v) { return hash_argument(c10::IValue(v)); }
  static bool same(const T& v, const c10::IValue& built_for) { return same_argument(c10::IValue(v), built_for); }
};

// A concrete int list boxes as a list of Ints.
inline uint64_t hash_ints(c10::ArrayRef<int64_t> values) {
  uint64_t h = kListSeed;
  for (int64_t x : values) h = mix(h, mix(kIntTag, static_cast<uint64_t>(x)));
  return h;
}
inline bool same_ints(c10::ArrayRef<int64_t> values, const c10::IValue& built_for) {
  if (!built_for.isIntList()) return false;
  const auto list = built_for.toListRef();
  if (list.size() != values.size()) return false;
  for (size_t i = 0; i < values.size(); ++i)
    if (list[i].toInt() != values[i]) return false;
  return true;
}

template <>
struct Argument<c10::ArrayRef<int64_t>> {
  static uint64_t hash(c10::ArrayRef<int64_t> v) { return hash_ints(v); }
  static bool same(c10::ArrayRef<int64_t> v, const c10::IValue& built_for) { return same_ints(v, built_for); }
};

template <>
struct Argument<c10::OptionalArrayRef<int64_t>> {
  static uint64_t hash(const c10::OptionalArrayRef<int64_t>& v) { return v ? hash_ints(*v) : kNoneHash; }
  static bool same(const c10::OptionalArrayRef<int64_t>& v, const c10::IValue& built_for) {
    return v ? same_ints(*v, built_for) : built_for.isNone();
  }
};

// A SymInt list boxes as an int list when every element is concrete (always, outside tracing);
// otherwise it is boxed as it is.
template <>
struct Argument<c10::ArrayRef<c10::SymInt>> {
  static uint64_t hash(c10::ArrayRef<c10::SymInt> v) {
    if (auto ints = c10::asIntArrayRefSlowOpt(v)) return hash_ints(*ints);
    return hash_argument(c10::IValue(v));
  }
  static bool same(c10::ArrayRef<c10::SymInt> v, const c10::IValue& built_for) {
    if (auto ints = c10::asIntArrayRefSlowOpt(v)) return same_ints(*ints, built_for);
    return same_argument(c10::IValue(v), built_for);
  }
};

// A string boxes as a string; std::hash gives a string and its view the same value.
template <>
struct Argument<c10::string_view> {
  static std::string_view chars(const c10::string_view& v) { return std::string_view(v.data(), v.size()); }
  static uint64_t hash(const c10::string_view& v) { return mix(kStringTag, std::hash<std::string_view>()(chars(v))); }
  static bool same(const c10::string_view& v, const c10::IValue& built_for) {
    return built_for.isString() && std::string_view(built_for.toStringRef()) == chars(v);
  }
};

}  // namespace propagation_key
}  // namespace shardtensor
