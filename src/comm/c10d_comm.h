// Construction of Comm objects over c10d groups. Names c10d types only by forward declaration;
// the definitions stay in c10d_comm.cpp and c10d_mesh.cpp.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "util/torch_compat.h"

namespace shardtensor {

// A Comm over a c10d backend (ProcessGroupGloo, ProcessGroupNCCL; on 2.x a user's
// ProcessGroup is first reduced to its backend by compat::backend_of) whose group rank i is
// global rank `global_ranks[i]`. Collectives wait at most `timeout` and then raise with the
// group's ranks in the message.
std::shared_ptr<Comm> make_c10d_comm(c10::intrusive_ptr<C10dBackend> group, std::vector<int64_t> global_ranks,
                                     int64_t my_group_rank, std::chrono::milliseconds timeout);

}  // namespace shardtensor
