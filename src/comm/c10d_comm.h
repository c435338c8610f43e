// Construction of Comm objects over c10d groups. Names c10d types only by forward declaration;
// the definitions stay in c10d_comm.cpp and c10d_mesh.cpp.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "util/torch_compat.h"

namespace shardtensor {

// A Comm over a c10d backend (ProcessGroupGloo, ProcessGroupNCCL; on 2.x a user's
// ProcessGroup is first reduced to its backend by compat::backend_of) whose group rank i is
// global rank `global_ranks[i]`. Collectives wait at most `timeout` and then raise with the
// group's ranks in the message. `registered_name`: the group's name in torch.distributed's
// registry, by which torch.compile's graphs name it (empty: one that was not registered there,
// whose collectives cannot be traced: comm/traced_collectives.h).
std::shared_ptr<Comm> make_c10d_comm(c10::intrusive_ptr<C10dBackend> group, std::vector<int64_t> global_ranks,
                                     int64_t my_group_rank, std::chrono::milliseconds timeout,
                                     std::string registered_name = "");

// The live communicator made by make_c10d_comm whose number() is `number`, or null once it is
// gone (its mesh destroyed).
std::shared_ptr<Comm> c10d_comm_numbered(int64_t number);

}  // namespace shardtensor
