// One case of the operator sweep (op_sweep_test.cpp): global inputs and the function to run
// on them, once on plain tensors (the oracle) and once on randomly laid-out ShardTensors.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

namespace shardtensor::testing {

using Tensors = std::vector<at::Tensor>;

struct Case {
  std::string label;
  std::function<Tensors()> make;  // global inputs, drawn after a fixed seed
  std::function<at::Tensor(const Tensors&)> fn;
  std::vector<size_t> constants = {};  // inputs that never require grad (class weights, running stats)
};

// Calls an operator by its qualified name through the dispatcher (autograd included), with
// the schema's defaults for arguments not given.
at::Tensor call(const std::string& qualified, std::vector<c10::IValue> args);

at::Tensor unit(std::vector<int64_t> shape);    // uniform in (0.1, 0.9), double
at::Tensor normal(std::vector<int64_t> shape);  // standard normal, double

Case on(const std::string& label, std::function<Tensors()> make, std::function<at::Tensor(const Tensors&)> fn,
        std::vector<size_t> constants = {});

// Domain-parallel cases: convolution, pooling, resampling, padding, spatial normalisation.
std::vector<Case> spatial_cases();
// Scaled dot-product attention (attention_test.cpp); none where libtorch has no SDPA (1.13).
std::vector<Case> attention_cases();
// The CUDA SDPA operators through their CPU stand-ins (attention_operators_test.cpp); none on 1.13.
std::vector<Case> attention_operator_cases();

}  // namespace shardtensor::testing
