// Reading this process's place in the world from the environment, the way torchrun and mpirun
// publish it. Pure environment parsing; the rendezvous that uses it lives in src/comm.
#pragma once

#include <cstdint>
#include <string>

namespace shardtensor {

struct WorldEnv {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool launched = false;  // false: no launcher variables, a single-process world
};

// RANK/WORLD_SIZE/LOCAL_RANK (torchrun, shardrun) or OMPI_COMM_WORLD_* (mpirun) or
// PMI_RANK/PMI_SIZE; MASTER_ADDR/MASTER_PORT for the store. Raises on malformed values.
const WorldEnv& world_env();

}  // namespace shardtensor
