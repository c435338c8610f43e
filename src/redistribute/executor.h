// Runs a RedistributePlan on this rank's local tensor. The only place in redistribution where
// the rank matters (which slice do I send, which do I own).
#pragma once

#include "redistribute/plan.h"

namespace at {
class Tensor;
}

namespace shardtensor {

// `local` holds this rank's piece under `source`; returns its piece under the plan's last
// layout, always a fresh tensor (never a view of `local`). Every rank of the mesh must call
// this with the same source spec and plan.
// Parts larger than this travel as several messages, so that packing one overlaps sending
// another (default 4 MiB). Every rank must use the same value.
void set_message_bytes(int64_t bytes);

at::Tensor execute_redistribute(const at::Tensor& local, const ShardTensorSpec& source, const RedistributePlan& plan);

}  // namespace shardtensor
