// Distributed checkpoint for Python: save, load and save_async over flat name -> tensor maps.
// shardtensor/checkpoint.py flattens nested state dicts (a module's and an optimizer's) into
// these maps and writes loaded scalars back.
#include <optional>

#include "bindings.h"
#include "shardtensor/checkpoint.h"

namespace shardtensor::python {
namespace {

namespace ckpt = shardtensor::checkpoint;

ckpt::SaveOptions save_options(std::optional<DeviceMesh> mesh, bool fsync) {
  ckpt::SaveOptions options;
  options.mesh = std::move(mesh);
  options.fsync = fsync;
  return options;
}

}  // namespace

void bind_checkpoint(py::module_& m) {
  m.def(
      "checkpoint_save",
      [](const ckpt::StateDict& state, const std::string& dir, std::optional<DeviceMesh> mesh, bool fsync) {
        ckpt::save(state, dir, save_options(std::move(mesh), fsync));
      },
      py::arg("state"), py::arg("dir"), py::arg("mesh"), py::arg("fsync"), py::call_guard<py::gil_scoped_release>());

  // Fills the tensors of `state` in place; returns (missing keys, unexpected keys).
  m.def(
      "checkpoint_load",
      [](ckpt::StateDict state, const std::string& dir, bool strict, std::optional<DeviceMesh> mesh) {
        ckpt::LoadOptions options;
        options.strict = strict;
        options.mesh = std::move(mesh);
        const ckpt::LoadResult result = ckpt::load(state, dir, options);
        return std::make_pair(result.missing_keys, result.unexpected_keys);
      },
      py::arg("state"), py::arg("dir"), py::arg("strict"), py::arg("mesh"), py::call_guard<py::gil_scoped_release>());

  py::class_<ckpt::AsyncSave>(m, "AsyncSave")
      .def("wait", &ckpt::AsyncSave::wait, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("pending", &ckpt::AsyncSave::valid);
  m.def(
      "checkpoint_save_async",
      [](const ckpt::StateDict& state, const std::string& dir, std::optional<DeviceMesh> mesh, bool fsync) {
        return ckpt::save_async(state, dir, save_options(std::move(mesh), fsync));
      },
      py::arg("state"), py::arg("dir"), py::arg("mesh"), py::arg("fsync"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace shardtensor::python
