// Rendezvous and mesh construction: the world's c10d store, one process group per mesh-dim
// slice, and the DeviceMesh factories that need them.
//
// Each process builds only the groups it belongs to (one per mesh dim). A Gloo group forms by
// exchanging addresses through a prefix of the store, so groups need unique, rank-independent
// names: "shardtensor/mesh<k>/dim<d>/<first global rank of the slice>", where k counts meshes
// created in this process. That is why every rank must create the same meshes in one order.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#define SHARDTENSOR_COMPAT_C10D
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef SHARDTENSOR_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "comm/c10d_comm.h"
#include "mesh/mesh_impl.h"
#include "mesh/world_env.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// The world's store, created on first use: a TCPStore served by rank 0 when launched, an
// in-process HashStore for a single-process world.
c10::intrusive_ptr<c10d::Store> world_store(std::chrono::milliseconds timeout) {
  static std::mutex mutex;
  static c10::intrusive_ptr<c10d::Store> store;
  std::lock_guard<std::mutex> lock(mutex);
  if (store) return store;
  const WorldEnv& env = world_env();
  if (env.world_size == 1) {
    store = c10::make_intrusive<c10d::HashStore>();
    return store;
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(env.master_port);
  opts.isServer = env.rank == 0;
  opts.numWorkers = static_cast<size_t>(env.world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  try {
    store = compat::make_tcp_store(env.master_addr, opts);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "shardtensor: rank ", env.rank, " of ", env.world_size, " could not reach the rendezvous store at ",
                env.master_addr, ":", env.master_port, " (MASTER_ADDR/MASTER_PORT): ", e.what());
  }
  return store;
}

// One Gloo transport device per process. Loopback when the master is local (shardrun, tests),
// GLOO_SOCKET_IFNAME when set, else the address the host name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device() {
  static std::shared_ptr<::gloo::transport::Device> device = [] {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    const std::string& addr = world_env().master_addr;
    if (addr == "127.0.0.1" || addr == "localhost" || addr == "::1")
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }();
  return device;
}

// Local tensors of a "cuda" mesh live on cuda:LOCAL_RANK, as torchrun lays ranks out over a
// host's GPUs; modulo the visible count, so that one GPU per process (CUDA_VISIBLE_DEVICES set
// per rank) is cuda:0. Never the current device, which a library may have changed.
c10::Device resolve_device(const MeshOptions& options) {
  if (options.device_type == "cpu") return c10::Device(c10::kCPU);
  const int64_t visible = static_cast<int64_t>(at::getNumGPUs());
  TORCH_CHECK(visible > 0, "DeviceMesh: device_type \"cuda\" was requested on global rank ", world_env().rank,
              ", but this process sees no CUDA device (torch::cuda::is_available() is false); use device_type \"cpu\".");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world_env().local_rank % visible));
}

CommBackend resolve_backend(const MeshOptions& options) {
  TORCH_CHECK(options.device_type == "cpu" || options.device_type == "cuda", "DeviceMesh: device type '",
              options.device_type, "' is not supported; use \"cpu\" or \"cuda\".");
  if (options.backend != CommBackend::Auto) return options.backend;
  return options.device_type == "cuda" ? CommBackend::Nccl : CommBackend::Gloo;
}

std::shared_ptr<Comm> make_group(const std::vector<int64_t>& group_ranks, int64_t my_rank, const std::string& name,
                                 CommBackend backend, std::chrono::milliseconds timeout) {
  const int64_t group_rank = std::find(group_ranks.begin(), group_ranks.end(), my_rank) - group_ranks.begin();
  if (group_ranks.size() == 1) return make_self_comm(my_rank);
  auto store = c10::make_intrusive<c10d::PrefixStore>(name, world_store(timeout));
  const int size = static_cast<int>(group_ranks.size());
  try {
    if (backend == CommBackend::Gloo) {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(gloo_device());
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(group_rank), size, opts);
      return make_c10d_comm(std::move(pg), group_ranks, group_rank, timeout);
    }
#ifdef SHARDTENSOR_HAVE_NCCL
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(group_rank), size, opts);
    return make_c10d_comm(std::move(pg), group_ranks, group_rank, timeout);
#else
    TORCH_CHECK(false, "DeviceMesh: the NCCL backend was requested but this libtorch was built without NCCL; "
                "use device_type \"cpu\" (Gloo).");
#endif
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "DeviceMesh: creating the process group '", name, "' over global ranks [",
                join(group_ranks, ", "), "] failed: ", e.what());
  }
}

std::atomic<int64_t> mesh_counter{0};

DeviceMesh build_mesh(std::vector<int64_t> shape, std::vector<int64_t> ranks, std::vector<std::string> dim_names,
                      const MeshOptions& options) {
  const WorldEnv& env = world_env();
  // Validation is local and the same on every rank, so a bad layout raises everywhere before
  // any rank starts communicating.
  auto impl = make_mesh_topology(std::move(shape), std::move(ranks), std::move(dim_names), env.rank, env.world_size);
  const CommBackend backend = resolve_backend(options);
  impl->device_type = options.device_type;
  impl->device = resolve_device(options);
  impl->timeout = options.timeout;
  const int64_t mesh_id = mesh_counter++;
  for (int64_t d = 0; d < static_cast<int64_t>(impl->shape.size()); ++d) {
    std::vector<int64_t> group_ranks = ranks_along(*impl, d, impl->coordinate);
    const std::string name = "shardtensor/mesh" + std::to_string(mesh_id) + "/dim" + std::to_string(d) + "/" +
                             std::to_string(group_ranks.front()) + "/";
    impl->comms.push_back(make_group(group_ranks, env.rank, name, backend, options.timeout));
  }
  impl->mesh_comm = impl->shape.size() == 1
                        ? impl->comms.front()
                        : make_group(impl->ranks, env.rank, "shardtensor/mesh" + std::to_string(mesh_id) + "/all/", backend,
                                     options.timeout);
  return DeviceMesh(std::move(impl));
}

}  // namespace

DeviceMesh DeviceMesh::create(std::vector<int64_t> shape, std::vector<std::string> dim_names, const MeshOptions& options) {
  std::vector<int64_t> ranks(static_cast<size_t>(world_env().world_size));
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int64_t>(i);
  return build_mesh(std::move(shape), std::move(ranks), std::move(dim_names), options);
}

DeviceMesh DeviceMesh::from_ranks(std::vector<int64_t> shape, std::vector<int64_t> ranks,
                                  std::vector<std::string> dim_names, const MeshOptions& options) {
  return build_mesh(std::move(shape), std::move(ranks), std::move(dim_names), options);
}

DeviceMesh DeviceMesh::from_process_groups(std::vector<int64_t> shape, std::vector<int64_t> ranks,
                                           std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> groups,
                                           std::vector<std::string> dim_names, const MeshOptions& options,
                                           c10::intrusive_ptr<c10d::ProcessGroup> mesh_group) {
  const WorldEnv& env = world_env();
  auto impl = make_mesh_topology(std::move(shape), std::move(ranks), std::move(dim_names), env.rank, env.world_size);
  TORCH_CHECK(groups.size() == impl->shape.size(), "DeviceMesh::from_process_groups: ", groups.size(),
              " process groups given for a ", impl->shape.size(), "-d mesh; give one group per mesh dim.");
  resolve_backend(options);  // validates the device type
  impl->device_type = options.device_type;
  impl->device = resolve_device(options);
  impl->timeout = options.timeout;
  for (int64_t d = 0; d < static_cast<int64_t>(groups.size()); ++d) {
    std::vector<int64_t> group_ranks = ranks_along(*impl, d, impl->coordinate);
    TORCH_CHECK(groups[d], "DeviceMesh::from_process_groups: the group for mesh dim ", d, " is null.");
    TORCH_CHECK(groups[d]->getSize() == static_cast<int>(group_ranks.size()) &&
                    groups[d]->getRank() == static_cast<int>(impl->coordinate[d]),
                "DeviceMesh::from_process_groups: the group for mesh dim ", d, " has size ", groups[d]->getSize(),
                " and rank ", groups[d]->getRank(), ", but this rank's slice along that dim is global ranks [",
                join(group_ranks, ", "), "] where it is at position ", impl->coordinate[d], ".");
    // A slice of one rank needs no backend: its collectives are local copies, as in build_mesh.
    impl->comms.push_back(group_ranks.size() == 1
                              ? make_self_comm(env.rank)
                              : make_c10d_comm(compat::backend_of(groups[d], impl->device.type()), group_ranks,
                                               impl->coordinate[d], options.timeout));
  }
  if (impl->shape.size() == 1) {
    impl->mesh_comm = impl->comms.front();
  } else if (mesh_group) {
    const int64_t position = std::find(impl->ranks.begin(), impl->ranks.end(), env.rank) - impl->ranks.begin();
    TORCH_CHECK(mesh_group->getSize() == static_cast<int>(impl->ranks.size()) && mesh_group->getRank() == position,
                "DeviceMesh::from_process_groups: mesh_group has size ", mesh_group->getSize(), " and rank ",
                mesh_group->getRank(), "; it must span all ", impl->ranks.size(),
                " ranks with this rank at its row-major position ", position, ".");
    impl->mesh_comm =
        make_c10d_comm(compat::backend_of(mesh_group, impl->device.type()), impl->ranks, position, options.timeout);
  }
  return DeviceMesh(std::move(impl));
}

bool built_with_nccl() {
#ifdef SHARDTENSOR_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace shardtensor
