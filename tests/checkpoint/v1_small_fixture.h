// The state behind the committed checkpoint tests/checkpoint/data/v1_small/ (format version 1,
// written at 2 ranks by make_v1_small.cpp before the checkpoint's JSON and XXH64 moved to
// nlohmann-json and libxxhash). checkpoint_v1_test.cpp loads that directory and saves this
// state again, expecting the same bytes: the format is checked, not assumed, to be unchanged.
// Every value is a formula of its index, so the data files are not their own reference.
//   "w"     F32  [5, 3]  Shard(0), the default uneven split: rows [3, 2]
//   "v"     I64  [2, 7]  Shard(1), explicit uneven sizes [5, 2], values beyond 32 bits
//   "r"     BF16 [4]     Replicate: written once, by rank 0
//   "step"  I64  []      a plain scalar, written by rank 0
//   kOddName F64 [2]     a plain tensor whose name needs every kind of JSON escape
// chunk_bytes 16 splits every box into several checksum chunks.
// Regenerate it only on a deliberate format change, as a new directory (v2_small) beside it:
//   shardrun -n 2 build/tests/make_v1_small tests/checkpoint/data/v1_small
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "shardtensor/checkpoint.h"
#include "shardtensor/shardtensor.h"

namespace shardtensor::testing::v1_small {

// A quote, a backslash, the control characters that JSON has short escapes for (\t, \n) and
// one it has not (\x01), DEL, and a two-byte UTF-8 character ("é").
inline const std::string kOddName = "odd \"name\"\\\t\n\x01\x7f \xc3\xa9";

inline const char* kDir = "v1_small";
inline constexpr int64_t kWorldSize = 2;

inline at::Tensor value(const std::string& name) {
  if (name == "w") return at::arange(15, at::kFloat).reshape({5, 3}) * 0.5 - 3;
  if (name == "v") return at::arange(14, at::kLong).reshape({2, 7}) * (int64_t(1) << 40) - 5;
  if (name == "r") return (at::arange(4, at::kFloat) * 0.25 + 1).to(at::kBFloat16);
  if (name == "step") return at::scalar_tensor(42, at::kLong);  // 0-d
  if (name == kOddName) return (at::arange(2, at::kDouble) + 1) / 3;
  TORCH_CHECK(false, "v1_small: no tensor '", name, "'");
}

// `mesh` is a flat mesh of kWorldSize ranks.
inline checkpoint::StateDict state(const DeviceMesh& mesh) {
  return {
      {"w", distribute_tensor(value("w"), mesh, {Shard(0)})},
      {"v", distribute_tensor(value("v"), mesh, {Shard(1)}, ShardSizes{{1, {5, 2}}})},
      {"r", distribute_tensor(value("r"), mesh, {Replicate()})},
      {"step", value("step")},
      {kOddName, value(kOddName)},
  };
}

inline checkpoint::SaveOptions save_options() {
  checkpoint::SaveOptions o;
  o.chunk_bytes = 16;
  o.fsync = false;
  return o;
}

}  // namespace shardtensor::testing::v1_small
