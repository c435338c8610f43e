// The group a checkpoint call agrees over, and its one primitive: every rank contributes a
// small row of int64 and gets every rank's row (an all-gather over the mesh). Save uses it as
// its barriers and to collect checksums; load uses it once, to agree that every rank
// validated. Without a mesh (a single-process world) the group is this process alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtensor/checkpoint.h"
#include "shardtensor/device_mesh.h"

namespace shardtensor::checkpoint {

class Agreement {
 public:
  // `mesh` if given, else the mesh of the first ShardTensor of `state` by name; without either
  // the world must have one rank. Checks that every ShardTensor's mesh spans the group's ranks.
  static Agreement for_state(const char* api, const StateDict& state, const std::optional<DeviceMesh>& mesh);

  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  int64_t position() const { return position_; }              // this rank's row in gather()
  const std::vector<int64_t>& ranks() const { return ranks_; }  // global rank of each row
  int64_t rank() const { return ranks_[position_]; }

  // Every rank's `row` (all of one length), in position order.
  std::vector<std::vector<int64_t>> gather(const std::vector<int64_t>& row) const;

 private:
  std::optional<DeviceMesh> mesh_;
  std::vector<int64_t> ranks_;
  int64_t position_ = 0;
};

}  // namespace shardtensor::checkpoint
