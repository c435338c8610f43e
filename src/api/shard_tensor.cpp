// Looking inside a ShardTensor: is_shard_tensor, spec, to_local, the ShardTensor view class.
#include "shardtensor/shard_tensor.h"

#include <ostream>

#include "dispatch/shard_tensor_impl.h"
#include "shardtensor/redistribute.h"
#include "spec/sequence_order.h"
#include "util/strings.h"

namespace shardtensor {
namespace {
ShardTensorImpl& checked_impl(const char* api, const at::Tensor& t) {
  ShardTensorImpl* impl = shard_tensor_impl(t);
  TORCH_CHECK(impl, api, ": expects a ShardTensor, got ",
              t.defined() ? "a plain " + t.toString() + " of shape [" + join(t.sizes(), ", ") + "]" : std::string("an undefined tensor"),
              ". Build one with from_local().");
  return *impl;
}
}  // namespace

bool is_shard_tensor(const at::Tensor& t) { return shard_tensor_impl(t) != nullptr; }
const ShardTensorSpec& spec(const at::Tensor& t) { return checked_impl("spec", t).spec(); }
at::Tensor to_local(const at::Tensor& t) {
  checked_impl("to_local", t);
  return to_local(t, std::nullopt);  // differentiable when t requires grad (redistribute.cpp)
}

ShardTensor::ShardTensor(at::Tensor t) : at::Tensor(std::move(t)) { checked_impl("ShardTensor", *this); }
const ShardTensorSpec& ShardTensor::spec() const { return checked_impl("ShardTensor::spec", *this).spec(); }
at::Tensor ShardTensor::to_local() const {
  checked_impl("ShardTensor::to_local", *this);
  return shardtensor::to_local(*this);
}

std::ostream& operator<<(std::ostream& os, const ShardTensor& t) {
  if (!t.defined()) return os << "ShardTensor(undefined)";
  const ShardTensorSpec& s = t.spec();
  os << "ShardTensor(shape [" << join(s.shape(), ", ") << "], " << c10::toString(s.dtype()) << ", "
     << to_string(s.placements()) << " on " << s.mesh();
  for (const DimSharding& d : s.shardings()) os << ", dim " << d.tensor_dim << " sizes [" << join(d.sizes, ", ") << "]";
  os << "; rank " << s.mesh().rank() << " holds [" << join(s.local_shape(), ", ") << "]";
  if (!has_zigzag(s)) os << " at offsets [" << join(s.local_offsets(), ", ") << "]";  // a zigzag piece is two stretches
  return os << " on " << t.to_local().device() << ")";
}

}  // namespace shardtensor
