// Every difference between the libtorch versions we build against lives here (Debian's 1.13.1
// and the 2.x wheel, tested as 2.15.0). Code elsewhere uses these names and never tests
// versions.
//
// The first part is light (forward declarations and aliases) and may be included anywhere.
// The second part needs c10d's headers, so only a file that defines SHARDTENSOR_COMPAT_C10D
// before including this one gets it: src/comm's c10d files and the test that builds its own
// process group (STYLE.md: c10d headers stay in src/comm).
#pragma once

#include <torch/version.h>

// libtorch 2.0 split c10d::ProcessGroup into a front (ProcessGroup, what torch.distributed
// hands out) and per-device backends (c10d::Backend): ProcessGroupGloo and ProcessGroupNCCL
// became Backends. Both classes offer the same collective methods, so the c10d adapter is
// written once over `C10dBackend`, and a user's ProcessGroup is reduced to its backend.
#if TORCH_VERSION_MAJOR >= 2
#define SHARDTENSOR_C10D_HAS_BACKEND 1
namespace c10d {
class Backend;
class ProcessGroup;
}  // namespace c10d
namespace shardtensor {
using C10dBackend = c10d::Backend;
}
#else
#define SHARDTENSOR_C10D_HAS_BACKEND 0
namespace c10d {
class ProcessGroup;
}
namespace shardtensor {
using C10dBackend = c10d::ProcessGroup;
}
#endif

// Gloo's native reduce-scatter (_reduce_scatter_base) came with 2.x (checked on 2.15); 1.13's
// raises, so there Comm runs it as an all_to_all and a local reduction.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
#define SHARDTENSOR_GLOO_HAS_REDUCE_SCATTER 1
#else
#define SHARDTENSOR_GLOO_HAS_REDUCE_SCATTER 0
#endif

// c10::Allocator::allocate lost its const in 2.3 (checked on 2.15), when copy_data became pure.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define SHARDTENSOR_ALLOCATE_CONST
#else
#define SHARDTENSOR_ALLOCATE_CONST const
#endif

#include <ATen/core/TensorBase.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

// Autograd nodes. 1.13 holds them in shared_ptrs freed through torch::autograd::deleteNode
// (which unrolls long chains instead of recursing); early 2.x in plain shared_ptrs, Node's
// destructor doing the unrolling; recent 2.x (2.15) in intrusive_ptrs, Node being an
// intrusive_ptr_target. `NodeT` derives from torch::autograd::Node, complete where this is
// called, so the choice is made by its base class rather than by a version number.
#if TORCH_VERSION_MAJOR < 2
namespace torch::autograd {
struct Node;
void deleteNode(Node* function);
}  // namespace torch::autograd
#endif
namespace shardtensor::compat {
template <typename NodeT, typename... Args>
auto make_autograd_node(Args&&... args) {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, NodeT>) {
    return c10::make_intrusive<NodeT>(std::forward<Args>(args)...);
  } else {
#if TORCH_VERSION_MAJOR >= 2
    return std::make_shared<NodeT>(std::forward<Args>(args)...);
#else
    return std::shared_ptr<NodeT>(new NodeT(std::forward<Args>(args)...), torch::autograd::deleteNode);
#endif
  }
}

// The owning and the weak pointer to an autograd node, whichever libtorch uses.
using NodePtr = std::decay_t<decltype(std::declval<const at::TensorBase&>().grad_fn())>;
template <class P>
struct WeakOf;
template <class T>
struct WeakOf<std::shared_ptr<T>> {
  using type = std::weak_ptr<T>;
};
template <class T>
struct WeakOf<c10::intrusive_ptr<T>> {
  using type = c10::weak_intrusive_ptr<T>;
};
using WeakNodePtr = typename WeakOf<NodePtr>::type;
}  // namespace shardtensor::compat

// The `.vec` overloads of the upsample operators (what Python's F.interpolate calls): 2.x
// decomposes them above autograd into the sized overloads, which have sharding rules; 1.13
// gives them backend kernels of their own, so shardtensor decomposes them itself there
// (dispatch/decompositions.h).
#if TORCH_VERSION_MAJOR < 2
#define SHARDTENSOR_DECOMPOSES_UPSAMPLE_VEC 1
#else
#define SHARDTENSOR_DECOMPOSES_UPSAMPLE_VEC 0
#endif

// Warning handlers: 2.x hands process() a c10::Warning and installs handlers through
// c10::WarningUtils; 1.13 passes the location and message apart, through c10::Warning.
namespace shardtensor::compat {
class MessageWarningHandler : public c10::WarningHandler {
 public:
  virtual void on_warning(const std::string& message) = 0;
#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning& warning) override { on_warning(warning.msg()); }
#else
  void process(const c10::SourceLocation&, const std::string& message, const bool) override { on_warning(message); }
#endif
};
inline void set_warning_handler(c10::WarningHandler* handler) {
#if TORCH_VERSION_MAJOR >= 2
  c10::WarningUtils::set_warning_handler(handler);
#else
  c10::Warning::set_warning_handler(handler);
#endif
}
}  // namespace shardtensor::compat

#ifdef SHARDTENSOR_COMPAT_C10D
#include <c10/core/DeviceType.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if SHARDTENSOR_C10D_HAS_BACKEND
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

namespace shardtensor::compat {

// The backend that runs collectives on `device_type` tensors for `group`: the group itself on
// 1.13, where ProcessGroupGloo/NCCL are ProcessGroups.
// ProcessGroup::hasBackendForDeviceType is public in some torch 2.x lines and not in others
// (2.11 lacks it); without it, getBackend's own error is the check.
template <typename Group, typename = void>
struct has_backend_query : std::false_type {};
template <typename Group>
struct has_backend_query<Group, std::void_t<decltype(std::declval<Group&>().hasBackendForDeviceType(c10::kCPU))>>
    : std::true_type {};

template <typename Group>
c10::intrusive_ptr<C10dBackend> checked_backend(Group& group, c10::DeviceType device_type) {
  const auto no_backend = [&](const std::string& detail) {
    TORCH_CHECK(false, "DeviceMesh::from_process_groups: the process group '", group.getBackendName(),
                "' has no backend for ", device_type,
                " tensors; create it with a backend for the mesh's device type (gloo for cpu, nccl for cuda).", detail);
  };
  if constexpr (has_backend_query<Group>::value) {
    if (!group.hasBackendForDeviceType(device_type)) no_backend("");
    return group.getBackend(device_type);
  } else {
    try {
      return group.getBackend(device_type);
    } catch (const std::exception& e) {
      no_backend(std::string(" (") + e.what() + ")");
      return {};
    }
  }
}

inline c10::intrusive_ptr<C10dBackend> backend_of(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                                  c10::DeviceType device_type) {
#if SHARDTENSOR_C10D_HAS_BACKEND
  return checked_backend(*group, device_type);
#else
  (void)device_type;
  return group;
#endif
}

// The name torch.distributed registered `group` under, by which its functional collectives find
// it (comm/traced_collectives.h); empty on 1.13, which has neither.
inline std::string registered_name(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
#if SHARDTENSOR_C10D_HAS_BACKEND
  return group->getGroupName();
#else
  (void)group;
  return "";
#endif
}

// A ProcessGroup (what a user of torch.distributed holds) over one backend, such as a
// ProcessGroupGloo built in C++. On 1.13 the backend already is one.
inline c10::intrusive_ptr<c10d::ProcessGroup> process_group_over(c10::intrusive_ptr<C10dBackend> backend,
                                                                 c10::intrusive_ptr<c10d::Store> store,
                                                                 c10::DeviceType device_type) {
#if SHARDTENSOR_C10D_HAS_BACKEND
  auto group = c10::make_intrusive<c10d::ProcessGroup>(std::move(store), backend->getRank(), backend->getSize());
  const auto type = c10d::ProcessGroup::strToBackendType(backend->getBackendName());
  group->setBackend(device_type, type, backend);
  group->setDefaultBackend(type);
  return group;
#else
  (void)store;
  (void)device_type;
  return backend;
#endif
}

namespace detail {
template <typename Options, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename Options>
struct HasUseLibUV<Options, std::void_t<decltype(std::declval<Options&>().useLibUV)>> : std::true_type {};
}  // namespace detail

// A TCPStore. From 2.4 the options ask for the libuv server by default, which a libtorch built
// without libuv refuses ("use_libuv was requested but PyTorch was build without libuv
// support"). Like torch.distributed, USE_LIBUV=0 turns it off; a refusal retries without it.
template <typename Options = c10d::TCPStoreOptions>
c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, Options options) {
  if constexpr (detail::HasUseLibUV<Options>::value) {
    const char* use_libuv = std::getenv("USE_LIBUV");
    if (use_libuv && std::string(use_libuv) == "0") options.useLibUV = false;
    try {
      return c10::make_intrusive<c10d::TCPStore>(host, options);
    } catch (const std::exception& e) {
      if (!options.useLibUV || std::string(e.what()).find("libuv") == std::string::npos) throw;
      options.useLibUV = false;
    }
  }
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

}  // namespace shardtensor::compat
#endif  // SHARDTENSOR_COMPAT_C10D
