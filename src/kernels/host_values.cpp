#include "kernels/host_values.h"

#include <ATen/ATen.h>

#include "util/below_tracer_modes.h"

namespace shardtensor {
namespace {

template <typename T>
at::Tensor real_tensor(const std::vector<T>& values, at::ScalarType dtype, c10::Device device) {
  const BelowTracerModes real_bytes;
  return at::tensor(values, at::TensorOptions().dtype(dtype).device(device));
}

}  // namespace

at::Tensor host_tensor(const std::vector<int64_t>& values, c10::Device device) { return real_tensor(values, at::kLong, device); }

at::Tensor host_tensor(const std::vector<double>& values, c10::Device device) { return real_tensor(values, at::kDouble, device); }

at::Tensor as_operand(const at::Tensor& value, const at::Tensor& piece) {
  const c10::DispatchKeySet keys = piece.key_set();
  const bool traced = keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::Functionalize);
  return traced ? at::lift_fresh(value) : value;
}

}  // namespace shardtensor
