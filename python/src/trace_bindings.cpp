// What torch.compile's traceable wrapper (shardtensor/_traceable.py) needs: a ShardTensor's
// layout as a hashable constant (Layout, the C++ spec), the wrapper's piece and layout back to a
// C++ ShardTensor and out again, and the tracing scope (comm/traced_collectives.h); and what a
// compiled graph's edges run on every call (shardtensor/_compile_trace.py): the guard of a
// ShardTensor argument, its piece handed in, and the ShardTensor results rebuilt.
#include <ATen/ScalarOps.h>
#include <pybind11/complex.h>
#include <torch/csrc/autograd/python_variable.h>

#include <tuple>

#include "bindings.h"
#include "shardtensor/shard_tensor.h"
#include "tracing.h"
#include "comm/traced_collectives.h"
#include "dispatch/dispatch_state.h"
#include "dispatch/plain_gradients.h"

namespace shardtensor::python {
namespace {

struct TracingContext {
  std::optional<TracingScope> scope;
  void enter() { scope.emplace(); }
  void exit() { scope.reset(); }
};

// `with _C.FallbackRefusal() as refusal:` (dispatch/dispatch_state.h); `refusal.refused` names
// the operator that would have fallen back, after the block raised.
struct RefusalContext {
  std::optional<FallbackRefusal> scope;
  std::string refused;
  RefusalContext& enter() {
    scope.emplace();
    return *this;
  }
  void exit(const py::args&) {
    refused = scope->refused();
    scope.reset();
  }
};

// guard_piece for any Python object: None where it is no tensor or not a ShardTensor of `layout`.
py::object guard_piece_or_none(py::handle x, const ShardTensorSpec& layout, c10::IntArrayRef strides) {
  if (!THPVariable_Check(x.ptr())) return py::none();
  at::Tensor alias = guard_piece(THPVariable_Unpack(x.ptr()), layout, strides);
  return alias.defined() ? py::cast(alias) : py::none();
}

// A guard of one ShardTensor argument of a compiled graph: guard_piece with the graph's layout
// and strides bound, so that dynamo's guard manager calls C++ directly on every call.
struct PieceGuard {
  ShardTensorSpec layout;
  std::vector<int64_t> strides;

  py::object operator()(py::handle x) const { return guard_piece_or_none(x, layout, strides); }
};

// A compiled graph whose results at some positions are ShardTensors' pieces, returning those as
// ShardTensors (shard_tensor_out_of_graph) on every call, with no Python frame of its own.
struct ShardTensorResults {
  struct Result {
    size_t position;
    ShardTensorSpec layout;
    std::vector<int64_t> strides;
  };
  py::object compiled;
  std::vector<Result> results;

  py::object operator()(const py::args& args, const py::kwargs& kwargs) const {
    py::object out = compiled(*args, **kwargs);
    py::list rebuilt(out);
    for (const Result& r : results)
      rebuilt[r.position] = py::cast(shard_tensor_out_of_graph(rebuilt[r.position].cast<at::Tensor>(), r.layout, r.strides));
    if (py::isinstance<py::tuple>(out)) return py::tuple(rebuilt);
    return std::move(rebuilt);
  }
};

}  // namespace

void bind_tracing(py::module_& m) {
  py::class_<ShardTensorSpec>(m, "Layout")
      .def("__eq__", [](const ShardTensorSpec& a, const ShardTensorSpec& b) { return a == b; })
      .def("__hash__", [](const ShardTensorSpec& s) { return s.hash(); })
      .def("__repr__", [](const ShardTensorSpec& s) { return s.to_string(); })
      // Immutable: dynamo's guards keep their context by deepcopy.
      .def("__copy__", [](const ShardTensorSpec& s) { return s; })
      .def("__deepcopy__", [](const ShardTensorSpec& s, const py::dict&) { return s; })
      .def_property_readonly("mesh", &ShardTensorSpec::mesh)
      .def_property_readonly("placements", [](const ShardTensorSpec& s) { return encode_placements(s.placements()); })
      .def_property_readonly("shape", &ShardTensorSpec::shape)
      .def_property_readonly("shard_sizes", [](const ShardTensorSpec& s) { return encode_sizes(s.shard_sizes()); })
      .def_property_readonly("local_shape", py::overload_cast<>(&ShardTensorSpec::local_shape, py::const_));
  m.def("layout_of", [](const at::Tensor& t) { return spec(t); }, py::arg("t"));
  m.def("shard_tensor_over", &shard_tensor_over, py::arg("local"), py::arg("layout"), py::arg("global_strides"));
  // A Python number where the schema takes a tensor (x * 2), as the C++ dispatcher passes it: a
  // wrapped number, which takes no part in type promotion.
  m.def(
      "wrapped_number",
      [](const py::object& number) {
        at::Scalar value;
        if (py::isinstance<py::bool_>(number))
          value = number.cast<bool>();
        else if (py::isinstance<py::int_>(number))
          value = number.cast<int64_t>();
        else if (PyComplex_Check(number.ptr()))
          value = c10::complex<double>(number.cast<std::complex<double>>());
        else
          value = number.cast<double>();
        at::Tensor t = c10::scalar_to_tensor(value);
        t.unsafeGetTensorImpl()->set_wrapped_number(true);
        return t;
      },
      py::arg("value"));
  m.def("local_piece_of", &local_piece_of, py::arg("t"));
  py::class_<GradientLayoutSlot, std::shared_ptr<GradientLayoutSlot>>(m, "GradientLayoutSlot")
      .def(py::init<>())
      .def_readwrite("layout", &GradientLayoutSlot::layout);
  m.def("piece_into_graph", &piece_into_graph, py::arg("t"), py::arg("slot"));
  m.def(
      "guard_piece",
      [](py::handle x, const ShardTensorSpec& layout, const std::vector<int64_t>& strides) {
        return guard_piece_or_none(x, layout, strides);
      },
      py::arg("x"), py::arg("layout"), py::arg("strides"));
  py::class_<PieceGuard>(m, "PieceGuard")
      .def(py::init<ShardTensorSpec, std::vector<int64_t>>(), py::arg("layout"), py::arg("strides"))
      .def("__call__", &PieceGuard::operator(), py::arg("x"));
  py::class_<ShardTensorResults>(m, "ShardTensorResults", py::dynamic_attr())
      .def(py::init([](py::object compiled, const std::vector<std::tuple<size_t, ShardTensorSpec, std::vector<int64_t>>>& results) {
             ShardTensorResults out{std::move(compiled), {}};
             for (const auto& [position, layout, strides] : results) out.results.push_back({position, layout, strides});
             return out;
           }),
           py::arg("compiled"), py::arg("results"))
      .def("__call__", &ShardTensorResults::operator());
  py::class_<TracingContext>(m, "TracingScope").def(py::init<>()).def("enter", &TracingContext::enter).def("exit", &TracingContext::exit);
  m.def("learn_python_function_node", &learn_python_function_node, py::arg("made_by_a_python_function"));
  py::class_<RefusalContext>(m, "FallbackRefusal")
      .def(py::init<>())
      .def("__enter__", &RefusalContext::enter, py::return_value_policy::reference)
      .def("__exit__", &RefusalContext::exit)
      .def_property_readonly("refused", [](const RefusalContext& r) -> py::object {
        return r.refused.empty() ? py::none() : py::cast(r.refused);
      });
}

}  // namespace shardtensor::python
