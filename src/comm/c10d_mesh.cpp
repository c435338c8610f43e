// Rendezvous and mesh construction: the world's c10d store, one process group per mesh-dim
// slice, and the DeviceMesh factories that need them.
//
// Each process builds only the groups it belongs to (one per mesh dim). A Gloo group forms by
// exchanging addresses through a prefix of the store, so groups need unique, rank-independent
// names: "shardtensor/mesh<k>/dim<d>/<first global rank of the slice>", where k counts meshes
// created in this process. That is why every rank must create the same meshes in one order.
//
// Creating a mesh waits at most the mesh's timeout ($SHARDTENSOR_TIMEOUT_S) at every step: the
// store connect, the job check (Note [Job identity]) and each group's rendezvous and connect
// (Note [Gloo's connect timeout]).
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

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <tuple>

#include "comm/c10d_comm.h"
#include "shardtensor/mesh_over_groups.h"
#include "mesh/mesh_impl.h"
#include "mesh/world_env.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// Note [Job identity]
// Two jobs on one MASTER_ADDR:MASTER_PORT meet at one store. The second job's rank 0 cannot
// bind the port and raises, but its other ranks connect to the first job's store as clients,
// and c10d lets any client in; so does a rank left over from an earlier run whose connect was
// still retrying. Unchecked, such a process joins the first job's groups: Gloo hands it the
// first job's addresses, and it waits in Gloo's connect or is wired in beside the real rank.
//
// So the world's store is checked before any group key is written to it:
// - rank 0 serves the store, so it is of the job that owns it. It publishes under kJobKey
//   the job's id, as the launcher named it (SHARDTENSOR_JOB_ID, which shardrun sets at random
//   per launch; else torchrun's TORCHELASTIC_RUN_ID unless "none"; else none), and a random
//   token;
// - every other rank compares that id with its own and, if they differ, raises at once. It
//   is the process that does not belong; it leaves before writing any key, so the job it
//   reached goes on unharmed. Every rank agrees with rank 0, hence with every other;
// - every rank then claims its rank number under the token; the first claim wins and a
//   second claimant raises, naming the holder. With no launcher id (mpirun, ranks started by
//   hand) this is the only check: it stops two processes from acting as one rank, but cannot
//   tell which of them is the intruder.
// Parent PIDs were considered as a fallback id and left out: ranks started by hand from two
// shells, or one per container, have different parents in a healthy job.
constexpr const char* kJobKey = "shardtensor/job";

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string text(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }

std::string random_hex(int words) {
  std::random_device device;
  std::string out;
  char word[9];
  for (int i = 0; i < words; ++i) {
    std::snprintf(word, sizeof(word), "%08x", static_cast<unsigned>(device()));
    out += word;
  }
  return out;
}

// This process's job as its launcher named it; empty when no launcher did.
std::string launcher_job_id() {
  if (const char* id = std::getenv("SHARDTENSOR_JOB_ID"); id && *id) return id;
  if (const char* id = std::getenv("TORCHELASTIC_RUN_ID"); id && *id && std::string(id) != "none")
    return std::string("torchrun:") + id;
  return "";
}

// An exception's message without c10's backtrace, for messages that quote it.
std::string message_of(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  return e.what();
}

std::string printable_job(const std::string& id) { return id.empty() ? "(none)" : "'" + id + "'"; }

// Host and pid, for messages, and a random tag that keeps two processes apart where the host
// name and pid do not (containers with their own pid namespaces).
std::string this_process() {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  return "pid " + std::to_string(getpid()) + " on " + host + " [" + random_hex(2) + "]";
}

// See Note [Job identity]. Raises, on the process that does not belong, what it found, what it
// expected and the likely cause.
void check_job_identity(c10d::Store& store, const WorldEnv& env) {
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  const std::string mine = launcher_job_id();
  std::string published;
  if (env.rank == 0) {
    published = random_hex(4) + " " + mine;
    store.set(kJobKey, bytes(published));
  } else {
    try {
      published = text(store.get(kJobKey));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "DeviceMesh: global rank ", env.rank, " of ", env.world_size, " reached the store at ", where,
                  ", but no job identity was published there (", message_of(e), "). The store may belong to another "
                  "program; is a second job using the same MASTER_ADDR:MASTER_PORT?");
    }
  }
  const size_t space = published.find(' ');
  TORCH_CHECK(space != std::string::npos, "DeviceMesh: the store at ", where, " holds '", published, "' under '", kJobKey,
              "', which is not a shardtensor job identity; is a second job using the same MASTER_ADDR:MASTER_PORT?");
  const std::string token = published.substr(0, space);
  const std::string theirs = published.substr(space + 1);
  TORCH_CHECK(theirs == mine, "DeviceMesh: this process (global rank ", env.rank, " of ", env.world_size, ", job ",
              printable_job(mine), ") reached the rendezvous store at ", where, ", which belongs to job ",
              printable_job(theirs), " (as its rank 0 published). The likely cause is a second job on the same "
              "MASTER_ADDR:MASTER_PORT, or a rank left over from an earlier run; give each job its own MASTER_PORT "
              "(shardrun picks a free one unless --port is given). Job ids come from SHARDTENSOR_JOB_ID (set by "
              "shardrun) or torchrun's TORCHELASTIC_RUN_ID.");
  const std::string me = this_process();
  const std::string holder = text(store.compareSet(std::string(kJobKey) + "/" + token + "/rank" + std::to_string(env.rank),
                                                   /*expectedValue=*/{}, bytes(me)));
  TORCH_CHECK(holder == me, "DeviceMesh: global rank ", env.rank, " of the job at ", where, " is already held by ",
              holder, "; this process (", me, ") was started as the same rank. The likely cause is a rank left over "
              "from an earlier run, or a second job on the same MASTER_ADDR:MASTER_PORT.");
}

// The world's store, created on first use: a TCPStore served by rank 0 when launched, an
// in-process HashStore for a single-process world. A TCPStore is kept only once this process
// has passed the job check.
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
  c10::intrusive_ptr<c10d::Store> tcp_store;
  try {
    tcp_store = compat::make_tcp_store(env.master_addr, opts);
  } catch (const std::exception& e) {
    const bool port_taken = opts.isServer && message_of(e).find("in use") != std::string::npos;
    TORCH_CHECK(false, "shardtensor: rank ", env.rank, " of ", env.world_size, " could not ",
                opts.isServer ? "serve" : "reach", " the rendezvous store at ", env.master_addr, ":", env.master_port,
                " (MASTER_ADDR/MASTER_PORT): ", message_of(e),
                port_taken ? ". Another process already listens on that port: most likely a second job on the same "
                             "MASTER_ADDR:MASTER_PORT, or a rank left over from an earlier run; give each job its own "
                             "MASTER_PORT."
                           : "");
  }
  check_job_identity(*tcp_store, env);
  store = std::move(tcp_store);
  return store;
}

// Note [Gloo's connect timeout]
// Gloo waits five times its timeout for a pair to connect (gloo/transport/tcp/pair.h: "Use a
// longer timeout when waiting for initial connect"): with SHARDTENSOR_TIMEOUT_S=20, a rank
// whose peer published an address and never connects waited 100 s (issue 14; 25 s at 5 s on
// both torch lines here). So a group is built with a fifth of the mesh's timeout, which makes
// Gloo's connect wait the timeout itself, and gets the full timeout back for its collectives
// once connected. A fifth is never less than 1 s (or the timeout, when that is shorter): Gloo
// may also wait only that long for its members' addresses, which the barrier in make_group
// makes a matter of milliseconds, yet on a loaded machine not zero. (A 2 s floor let a 3 s
// timeout wait 10 s in connect when a peer was killed there: the fault suite saw it.)
std::chrono::milliseconds gloo_connect_timeout(std::chrono::milliseconds timeout) {
  return std::max(timeout / 5, std::min(timeout, std::chrono::milliseconds(1000)));
}

// A ProcessGroupGloo whose timeout can be raised once it is connected. Torch 2.x has
// setTimeout(); 1.13 does not, but both keep options_ and contexts_ where a subclass reaches
// them, and their collectives read the timeout from there.
class GlooGroup final : public c10d::ProcessGroupGloo {
 public:
  using ProcessGroupGloo::ProcessGroupGloo;
  void set_collective_timeout(std::chrono::milliseconds timeout) {
    options_->timeout = timeout;
    for (auto& context : contexts_) context->setTimeout(timeout);
  }
};

// Every member of the group named by `store`'s prefix checks in and waits for the others, for
// at most `timeout`: the backend then starts its rendezvous with every member there.
void wait_for_members(c10d::Store& store, int64_t group_rank, const std::vector<int64_t>& group_ranks,
                      std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (size_t i = 0; i < group_ranks.size(); ++i) keys.push_back("arrived/" + std::to_string(i));
  store.set(keys[static_cast<size_t>(group_rank)], bytes("1"));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    std::vector<int64_t> missing;
    for (size_t i = 0; i < keys.size(); ++i)
      if (!store.check({keys[i]})) missing.push_back(group_ranks[i]);
    TORCH_CHECK(false, "DeviceMesh: global rank(s) [", join(missing, ", "), "] did not arrive to form the group over [",
                join(group_ranks, ", "), "] within the timeout (", timeout.count() / 1000.0,
                " s, SHARDTENSOR_TIMEOUT_S); they may have failed or be creating different meshes: ", message_of(e));
  }
}

// Gloo writes to its sockets without MSG_NOSIGNAL (libtorch 1.13's Gloo; the fault suite saw a
// survivor killed this way): a write to a peer that died raises SIGPIPE, whose default action
// kills this process instead of letting Gloo report the closed connection as an error. Where
// the program left SIGPIPE at its default, it is ignored from the first Gloo group on, as Python
// does at start-up; writes to a closed pipe or socket then fail with EPIPE instead.
void let_closed_sockets_fail_instead_of_killing() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
}

// One Gloo transport device per process. Loopback when the master is local (shardrun, tests),
// GLOO_SOCKET_IFNAME when set, else the address the host name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device() {
  static std::shared_ptr<::gloo::transport::Device> device = [] {
    let_closed_sockets_fail_instead_of_killing();
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

// `base`: the store to rendezvous through (torch.distributed's, for a mesh over its groups);
// by default the world's own.
std::shared_ptr<Comm> make_group(const std::vector<int64_t>& group_ranks, int64_t my_rank, const std::string& name,
                                 CommBackend backend, std::chrono::milliseconds timeout,
                                 c10::intrusive_ptr<c10d::Store> base = {}) {
  const int64_t group_rank = std::find(group_ranks.begin(), group_ranks.end(), my_rank) - group_ranks.begin();
  if (group_ranks.size() == 1) return make_self_comm(my_rank);
  auto world = base;
  if (!world) {
    world = world_store(timeout);
    world->setTimeout(timeout);  // the store outlives the mesh that created it; waits follow this mesh
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>(name, world);
  const int size = static_cast<int>(group_ranks.size());
  wait_for_members(*store, group_rank, group_ranks, timeout);
  try {
    if (backend == CommBackend::Gloo) {
      // See Note [Gloo's connect timeout].
      auto opts = c10d::ProcessGroupGloo::Options::create(gloo_connect_timeout(timeout));
      opts->devices.push_back(gloo_device());
      auto pg = c10::make_intrusive<GlooGroup>(store, static_cast<int>(group_rank), size, opts);
      pg->set_collective_timeout(timeout);
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
  // Counted on every rank, members or not, so that group names agree (see the file comment).
  const int64_t mesh_id = mesh_counter++;
  if (impl->coordinate.empty()) return DeviceMesh(std::move(impl));  // outside the mesh: no groups to join
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
  const int64_t world = world_env().world_size;
  int64_t total = 1;
  for (int64_t s : shape) total *= std::max<int64_t>(s, 0);  // a dim < 1 raises in make_mesh_topology
  TORCH_CHECK(total == world || total < 1, "DeviceMesh: mesh shape ", join(shape, "x"), " holds ", total, " ranks but the world has ",
              world, " (", total < world ? "some ranks would be missing from the mesh" : "the mesh names ranks that do not exist",
              "). Use a shape whose product is ", world, ", or DeviceMesh::from_ranks for a mesh over some of the ranks.");
  std::vector<int64_t> ranks(static_cast<size_t>(world));
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
  return mesh_over_process_groups(std::move(shape), std::move(ranks), std::move(groups), std::move(dim_names), options,
                                  std::move(mesh_group), {});
}

DeviceMesh mesh_over_process_groups(std::vector<int64_t> shape, std::vector<int64_t> ranks,
                                    std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> groups,
                                    std::vector<std::string> dim_names, const MeshOptions& options,
                                    c10::intrusive_ptr<c10d::ProcessGroup> mesh_group,
                                    c10::intrusive_ptr<c10d::Store> build_mesh_group_through) {
  const WorldEnv& env = world_env();
  auto impl = make_mesh_topology(std::move(shape), std::move(ranks), std::move(dim_names), env.rank, env.world_size);
  TORCH_CHECK(groups.size() == impl->shape.size(), "DeviceMesh::from_process_groups: ", groups.size(),
              " process groups given for a ", impl->shape.size(), "-d mesh; give one group per mesh dim.");
  resolve_backend(options);  // validates the device type
  impl->device_type = options.device_type;
  impl->device = resolve_device(options);
  impl->timeout = options.timeout;
  // Outside the mesh there are no groups to hold (torch.distributed gives non-members none).
  if (impl->coordinate.empty()) return DeviceMesh(std::move(impl));
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
                                               impl->coordinate[d], options.timeout, compat::registered_name(groups[d])));
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
        make_c10d_comm(compat::backend_of(mesh_group, impl->device.type()), impl->ranks, position, options.timeout,
                       compat::registered_name(mesh_group));
  } else if (build_mesh_group_through) {
    // Named by the layout and how many times this process built it: the mesh's ranks build the
    // same layouts in one order, as every mesh's groups are built.
    static std::mutex mutex;
    static std::map<std::vector<int64_t>, int64_t> built;
    int64_t count;
    {
      std::lock_guard<std::mutex> lock(mutex);
      count = built[impl->ranks]++;
    }
    impl->mesh_comm = make_group(impl->ranks, env.rank,
                                 "shardtensor/over/" + join(impl->ranks, ",") + "/" + std::to_string(count) + "/",
                                 resolve_backend(options), options.timeout, build_mesh_group_through);
  }
  return DeviceMesh(std::move(impl));
}

DeviceMesh DeviceMesh::of_dims(const std::vector<int64_t>& dims) const {
  std::vector<int64_t> all(static_cast<size_t>(ndim()));
  for (size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int64_t>(d);
  if (dims == all) return *this;
  check_includes_this_rank("has no slice of it to take");
  // One mesh (and mesh-wide group) per mesh and dims, made once: every parameter fully_shard
  // nests in the same dims asks for it.
  static std::mutex cache_mutex;
  static std::vector<std::tuple<std::shared_ptr<const Impl>, std::vector<int64_t>, DeviceMesh>> cache;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    for (const auto& [root, root_dims, mesh] : cache)
      if (root == impl_ && root_dims == dims) return mesh;
  }
  std::vector<bool> seen(all.size(), false);
  for (int64_t d : dims) {
    size(d);  // range check
    TORCH_CHECK(!seen[static_cast<size_t>(d)], "DeviceMesh::of_dims: dim ", d, " appears twice in [", join(dims, ", "), "]");
    seen[static_cast<size_t>(d)] = true;
  }
  std::vector<int64_t> shape, ranks;
  std::vector<std::string> names;
  for (int64_t d : dims) {
    shape.push_back(impl_->shape[d]);
    if (!impl_->dim_names.empty()) names.push_back(impl_->dim_names[d]);
  }
  std::vector<int64_t> coordinate = impl_->coordinate;
  const int64_t count = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  for (int64_t position = 0; position < count; ++position) {  // row-major over `dims`
    int64_t rest = position;
    for (size_t i = dims.size(); i-- > 0;) {
      coordinate[dims[i]] = rest % impl_->shape[dims[i]];
      rest /= impl_->shape[dims[i]];
    }
    ranks.push_back(rank_at(coordinate));
  }
  auto out = make_mesh_topology(std::move(shape), std::move(ranks), std::move(names), impl_->rank, world_env().world_size);
  out->device_type = impl_->device_type;
  out->device = impl_->device;
  out->timeout = impl_->timeout;
  if (has_comms()) {
    for (int64_t d : dims) out->comms.push_back(impl_->comms[d]);
    if (dims.size() == 1) {
      out->mesh_comm = impl_->comms[dims[0]];
    } else {
      // Named by the layout and how many times this process built it: the mesh's ranks build
      // the same layouts in one order, as every mesh's groups are built.
      static std::map<std::vector<int64_t>, int64_t> built;
      int64_t n;
      {
        std::lock_guard<std::mutex> lock(cache_mutex);
        n = built[out->ranks]++;
      }
      MeshOptions options;
      options.device_type = impl_->device_type;
      options.timeout = impl_->timeout;
      out->mesh_comm = make_group(out->ranks, impl_->rank, "shardtensor/of_dims/" + join(out->ranks, ",") + "/" +
                                  std::to_string(n) + "/", resolve_backend(options), impl_->timeout);
    }
  }
  DeviceMesh mesh(std::move(out));
  std::lock_guard<std::mutex> lock(cache_mutex);
  cache.emplace_back(impl_, dims, mesh);
  return mesh;
}

bool built_with_nccl() {
#ifdef SHARDTENSOR_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace shardtensor
