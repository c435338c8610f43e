// What the attention tests share (attention_test.cpp, attention_operators_test.cpp): their
// inputs and their comparison with one process.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dist/dist_fixture.h"

namespace shardtensor::testing {

// Standard normal float32 values after a fixed seed: the same on every rank.
inline at::Tensor draw(std::vector<int64_t> shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape, at::kFloat);
}

// The whole of `sharded` equals one process's `expected` within float32 rounding (1e-5).
inline void expect_close(const at::Tensor& sharded, const at::Tensor& expected, const std::string& what) {
  const at::Tensor got = full_tensor(sharded);
  ASSERT_EQ(got.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::allclose(got, expected, /*rtol=*/1e-5, /*atol=*/1e-5))
      << what << ": max difference " << (got - expected).abs().max().item<double>();
}

}  // namespace shardtensor::testing
