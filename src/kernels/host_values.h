// Tensors of values a kernel computed on the host (gather indices, interpolation weights,
// pooling divisors), beside the pieces it works on.
//
// While torch.compile traces, the pieces hold no bytes and the tracer's modes intercept every
// tensor a kernel makes, so a tensor filled from host memory would have no storage to fill. These
// are made below those modes, with real bytes, whether they are built while tracing or not (a
// lowered plan made during a trace serves eager calls too); beside a traced piece, as_operand
// lifts one into the graph as a constant.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace shardtensor {

at::Tensor host_tensor(const std::vector<int64_t>& values, c10::Device device);
at::Tensor host_tensor(const std::vector<double>& values, c10::Device device);

// `value` (a host_tensor) as an operand of an operator on `piece`: itself, or where the piece is
// one the tracer records (fake or functional), the graph's constant of it.
at::Tensor as_operand(const at::Tensor& value, const at::Tensor& piece);

}  // namespace shardtensor
