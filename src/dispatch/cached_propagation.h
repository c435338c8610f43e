// The direct kernels' lookup of a cached propagation from their typed arguments (the key:
// propagation_key.h; the cache: propagation.h).
#pragma once

#include "dispatch/propagation.h"
#include "dispatch/propagation_key.h"

namespace shardtensor {
namespace propagation_key {

// The key and the hit check over a call's typed arguments. Tensors are inputs (none of the
// direct operators has an out= argument); an absent optional tensor boxes as None.
class TypedCall {
 public:
  explicit TypedCall(const Propagation& p) : p_(p) {}

  static uint64_t hash(const at::Tensor& t) { return propagation_key::hash_tensor(t); }
  static uint64_t hash(const c10::optional<at::Tensor>& t) { return t ? propagation_key::hash_tensor(*t) : kNoneHash; }
  template <class T>
  static uint64_t hash(const T& v) {
    return Argument<T>::hash(v);
  }

  bool same(const at::Tensor& t) {
    if (!p_.tensor_arguments[i_++]) return false;
    if (!t.defined()) return true;  // boxed, a tensor argument but no input
    return k_ < p_.meta.inputs.size() && same_input_spec(t, p_.meta.inputs[k_++].spec);
  }
  bool same(const c10::optional<at::Tensor>& t) {
    if (t) return same(*t);
    return !p_.tensor_arguments[i_] && p_.arguments[i_++].isNone();
  }
  template <class T>
  bool same(const T& v) {
    if (p_.tensor_arguments[i_]) return false;
    return Argument<T>::same(v, p_.arguments[i_++]);
  }
  bool all_inputs_seen() const { return k_ == p_.meta.inputs.size(); }

 private:
  const Propagation& p_;
  size_t i_ = 0, k_ = 0;
};

// The cached propagation of the call on `args`, or nullptr: on a miss, box the arguments and
// call propagate().
template <class... Args>
Propagation* find_cached(const c10::FunctionSchema& schema, const Args&... args) {
  uint64_t key = seed(schema);
  ((key = mix(key, TypedCall::hash(args))), ...);
  Propagation* p = entry_for(key);
  if (!p || p->arguments.size() != sizeof...(Args)) return nullptr;
  TypedCall call(*p);
  const bool same = (call.same(args) && ...);
  return same && call.all_inputs_seen() ? p : nullptr;
}

}  // namespace propagation_key
}  // namespace shardtensor
