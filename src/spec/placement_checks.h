// The placement checks every entry point shares (spec construction, from_local, later
// redistribute), so they raise the same message for the same mistake.
#pragma once

#include <string>

#include "shardtensor/device_mesh.h"
#include "shardtensor/placement.h"

namespace shardtensor {

// Checks one placement per mesh dim and Shard dims in [-ndim, ndim); returns the placements
// with negative Shard dims counted from the end. `api` starts the message ("from_local").
Placements normalize_placements(const std::string& api, const DeviceMesh& mesh, Placements placements, int64_t ndim);

}  // namespace shardtensor
