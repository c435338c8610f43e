// DTensor's register_sharding from Python: the C++ rule calls a Python function on a
// propagation miss only (hits never reach Python), with the GIL taken for that call.
#include <torch/csrc/jit/python/pybind_utils.h>

#include "bindings.h"
#include "shardtensor/sharding_rule.h"

namespace shardtensor::python {
namespace {

py::tuple describe_spec(const ShardTensorSpec& spec) {
  return py::make_tuple(spec.mesh(), encode_placements(spec.placements()), spec.shape(), spec.dtype());
}

// The call's arguments for the Python side: (name, kwarg_only, kind, payload) per schema
// argument; kind "tensor" (payload: mesh, placements, shape, dtype), "tensors" (a list of
// those) or "value" (the Python value).
py::list describe_arguments(const OpMeta& op) {
  py::list out;
  const auto& arguments = op.schema->arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    py::list tensors;
    for (const TensorInput& in : op.inputs)
      if (in.arg_index == i) tensors.append(describe_spec(in.spec));
    const bool is_list = arguments[i].type()->kind() == c10::TypeKind::ListType;
    const char* kind = tensors.empty() ? "value" : is_list ? "tensors" : "tensor";
    py::object payload = tensors.empty() ? torch::jit::toPyObject(op.args[i]) : is_list ? py::object(tensors) : tensors[0];
    out.append(py::make_tuple(arguments[i].name(), arguments[i].kwarg_only(), kind, payload));
  }
  return out;
}

std::vector<std::optional<Placement>> decode_list(const py::handle& encoded) {
  std::vector<std::optional<Placement>> out;
  for (const py::handle& item : encoded) {
    if (item.is_none()) out.emplace_back(std::nullopt);
    else out.emplace_back(decode_placements({item.cast<std::pair<int, int64_t>>()}).front());
  }
  return out;
}

// A Python exception raised by the user's function, as the C++ error of its kind.
[[noreturn]] void rethrow(const OpMeta& op, py::error_already_set& e) {
  const std::string message = op.name + ": its register_sharding function raised " + e.what();
  if (e.matches(PyExc_ValueError)) TORCH_CHECK_VALUE(false, message);
  if (e.matches(PyExc_TypeError)) TORCH_CHECK_TYPE(false, message);
  TORCH_CHECK(false, message);
}

}  // namespace

void bind_rules(py::module_& m) {
  m.def(
      "register_sharding",
      [](const std::string& op_name, py::function strategy) {
        // Kept for the life of the process: rules live in a process-wide registry that outlives
        // the interpreter's teardown, so the function is never released without the GIL.
        auto* fn = new py::object(std::move(strategy));
        register_sharding(op_name, [fn](const OpMeta& op) {
          py::gil_scoped_acquire gil;
          std::vector<AcceptableSharding> options;
          try {
            py::object result = (*fn)(op.name, describe_arguments(op));
            for (const py::handle& option : result) {
              auto pair = option.cast<py::tuple>();
              options.push_back({decode_list(pair[0]), decode_list(pair[1])});
            }
          } catch (py::error_already_set& e) {
            rethrow(op, e);
          }
          return options;
        });
      },
      py::arg("op_name"), py::arg("strategy"));
}

}  // namespace shardtensor::python
