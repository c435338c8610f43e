// DeviceMesh for Python: built by the C++ rendezvous, or over process groups that
// torch.distributed already holds (the usual torchrun program), so no second rendezvous opens.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#include "bindings.h"
#include "shardtensor/device_mesh.h"
#include "shardtensor/mesh_over_groups.h"

namespace shardtensor::python {
namespace {

MeshOptions options_for(const std::string& device_type, double timeout_s) {
  MeshOptions options;
  options.device_type = device_type;
  if (timeout_s > 0) options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  return options;
}

using GroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

// torch.distributed's ProcessGroup objects are pybind11 instances of c10d::ProcessGroup held
// by intrusive_ptr; the cast shares torch's type registry (same bundled pybind11).
GroupPtr group_from(const py::handle& group) {
  if (group.is_none()) return {};
  try {
    return group.cast<GroupPtr>();
  } catch (const py::cast_error&) {
    throw py::type_error("expected a torch.distributed ProcessGroup, got " +
                         std::string(py::str(py::type::of(group).attr("__name__"))));
  }
}

}  // namespace

void bind_mesh(py::module_& m) {
  py::class_<DeviceMesh>(m, "DeviceMesh")
      .def_static(
          "create",
          [](std::vector<int64_t> shape, std::vector<std::string> names, const std::string& device_type, double timeout_s) {
            return DeviceMesh::create(std::move(shape), std::move(names), options_for(device_type, timeout_s));
          },
          py::arg("shape"), py::arg("dim_names"), py::arg("device_type"), py::arg("timeout_s"),
          py::call_guard<py::gil_scoped_release>())
      .def_static(
          "from_process_groups",
          [](std::vector<int64_t> shape, std::vector<int64_t> ranks, const std::vector<py::object>& groups,
             std::vector<std::string> names, const std::string& device_type, double timeout_s,
             const py::object& mesh_group, const py::object& build_mesh_group_through) {
            std::vector<GroupPtr> cpp_groups;
            for (const py::object& g : groups) cpp_groups.push_back(group_from(g));
            GroupPtr whole = group_from(mesh_group);
            c10::intrusive_ptr<c10d::Store> store;
            if (!build_mesh_group_through.is_none()) store = build_mesh_group_through.cast<c10::intrusive_ptr<c10d::Store>>();
            py::gil_scoped_release no_gil;
            return mesh_over_process_groups(std::move(shape), std::move(ranks), std::move(cpp_groups), std::move(names),
                                            options_for(device_type, timeout_s), std::move(whole), std::move(store));
          },
          py::arg("shape"), py::arg("ranks"), py::arg("groups"), py::arg("dim_names"), py::arg("device_type"),
          py::arg("timeout_s"), py::arg("mesh_group"), py::arg("build_mesh_group_through") = py::none())
      .def_static("without_comms", &DeviceMesh::without_comms, py::arg("shape"), py::arg("my_rank"),
                  py::arg("dim_names") = std::vector<std::string>{}, py::arg("device_type") = std::string("cpu"))
      .def_property_readonly("ndim", &DeviceMesh::ndim)
      .def_property_readonly("shape", &DeviceMesh::shape)
      .def_property_readonly("dim_names", &DeviceMesh::dim_names)
      .def_property_readonly("rank", &DeviceMesh::rank)
      .def_property_readonly("includes_this_rank", &DeviceMesh::includes_this_rank)
      .def_property_readonly("coordinate", &DeviceMesh::coordinate)
      .def_property_readonly("ranks", &DeviceMesh::ranks)
      .def_property_readonly("device_type", &DeviceMesh::device_type)
      .def_property_readonly("device", &DeviceMesh::device)
      .def_property_readonly("timeout_s", [](const DeviceMesh& mesh) { return mesh.timeout().count() / 1000.0; })
      .def_property_readonly("has_comms", &DeviceMesh::has_comms)
      .def("size", py::overload_cast<int64_t>(&DeviceMesh::size, py::const_), py::arg("mesh_dim"))
      .def("size", py::overload_cast<>(&DeviceMesh::size, py::const_))
      .def("mesh_dim", &DeviceMesh::mesh_dim, py::arg("name"))
      .def("submesh", py::overload_cast<int64_t>(&DeviceMesh::submesh, py::const_), py::arg("mesh_dim"))
      .def("coordinate_of", &DeviceMesh::coordinate_of, py::arg("global_rank"))
      .def("__eq__", [](const DeviceMesh& a, const DeviceMesh& b) { return a == b; })
      .def("__hash__", &DeviceMesh::hash)
      .def("__repr__", &DeviceMesh::to_string);

  m.def("world_rank", &world_rank);
  m.def("world_size", &world_size);
  m.def("built_with_nccl", &built_with_nccl);
  // Without the GIL: dropping the last reference to a Gloo backend joins its worker threads,
  // and a worker may need the GIL to release a Python tensor its last collective kept.
  m.def("release_communicators", &release_communicators, py::call_guard<py::gil_scoped_release>());
}

}  // namespace shardtensor::python
