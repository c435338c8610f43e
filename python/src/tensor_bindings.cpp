// ShardTensors for Python: building them, looking inside them, moving them between layouts.
// A ShardTensor crosses into Python as a plain torch.Tensor (THPVariable over the C++
// ShardTensorImpl), so operators on it dispatch in C++ with no Python in between.
#include <torch/csrc/Dtype.h>

#include <sstream>

#include "bindings.h"
#include "shardtensor/context_parallel.h"
#include "shardtensor/dispatch.h"
#include "shardtensor/factories.h"
#include "shardtensor/redistribute.h"
#include "shardtensor/shard_tensor.h"

namespace shardtensor::python {
namespace {

std::optional<Placements> decode_optional(const std::optional<EncodedPlacements>& encoded) {
  if (!encoded) return std::nullopt;
  return decode_placements(*encoded);
}

std::optional<ShardSizes> decode_optional(const std::optional<EncodedSizes>& encoded) {
  if (!encoded) return std::nullopt;
  return decode_sizes(*encoded);
}

// Python's transport= and peer_memory= keywords (None: this process's default).
TransportOptions transport_options(const std::optional<std::string>& transport, std::optional<bool> peer_memory) {
  TransportOptions options;
  if (transport) options.transport = parse_transport_preference(*transport, "transport");
  options.peer_memory = peer_memory;
  return options;
}

// `with shardtensor.transport_options(...)`: the C++ scope lives between enter() and exit().
struct TransportScope {
  TransportOptions options;
  std::optional<TransportOptionsScope> scope;
  void enter() {
    TORCH_CHECK(!scope, "this transport_options scope is already active; `with` it once at a time.");
    scope.emplace(options);
  }
  void exit() { scope.reset(); }
};

c10::ScalarType dtype_from(const py::handle& dtype) {
  TORCH_CHECK_TYPE(THPDtype_Check(dtype.ptr()), "dtype must be a torch.dtype, got ",
                   std::string(py::str(py::type::of(dtype).attr("__name__"))));
  return reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
}

ShardSizing sizing_from(const std::string& mode, const std::optional<std::vector<int64_t>>& global_shape,
                        const std::optional<EncodedSizes>& sizes) {
  if (mode == "chunk") return global_shape ? ShardSizing::chunk(*global_shape) : ShardSizing::chunk();
  if (mode == "infer") return ShardSizing::infer();
  if (mode == "trusted" && sizes) return ShardSizing::trusted(decode_sizes(*sizes));
  TORCH_CHECK_VALUE(mode == "given" && sizes, "sharding_shapes: '", mode,
                    "' is not allowed; use \"chunk\", \"infer\" or explicit sizes.");
  return ShardSizing::given(decode_sizes(*sizes));
}

// The one-line description that print(x) shows: global shape, dtype, placements, mesh, shard
// sizes and this rank's local piece (its values are local: no collective runs).
std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << ShardTensor(t);
  return os.str();
}

}  // namespace

void bind_tensor(py::module_& m) {
  m.def("is_shard_tensor", &is_shard_tensor, py::arg("t"));
  m.def(
      "from_local",
      [](const at::Tensor& local, const DeviceMesh& mesh, const EncodedPlacements& placements, const std::string& mode,
         const std::optional<std::vector<int64_t>>& global_shape, const std::optional<EncodedSizes>& sizes,
         bool run_check) {
        return from_local(local, mesh, decode_placements(placements), sizing_from(mode, global_shape, sizes), run_check);
      },
      py::arg("local"), py::arg("mesh"), py::arg("placements"), py::arg("mode"), py::arg("global_shape"),
      py::arg("sizes"), py::arg("run_check"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "to_local",
      [](const at::Tensor& t, const std::optional<EncodedPlacements>& grad_placements) {
        return to_local(t, grad_placements ? decode_placements(*grad_placements) : spec(t).placements());
      },
      py::arg("t"), py::arg("grad_placements"));
  m.def(
      "full_tensor",
      [](const at::Tensor& t, const std::optional<EncodedPlacements>& grad_placements) {
        return full_tensor(t, decode_optional(grad_placements));
      },
      py::arg("t"), py::arg("grad_placements"), py::call_guard<py::gil_scoped_release>());
  py::class_<TransportScope>(m, "TransportOptionsScope")
      .def(py::init([](const std::optional<std::string>& transport, std::optional<bool> peer_memory, std::optional<int64_t> peer_copy_bytes,
                       std::optional<int64_t> message_bytes, std::optional<bool> shared_arena) {
             auto* scope = new TransportScope{transport_options(transport, peer_memory), std::nullopt};
             scope->options.peer_copy_bytes = peer_copy_bytes;
             scope->options.message_bytes = message_bytes;
             scope->options.shared_arena = shared_arena;
             TORCH_CHECK(!peer_copy_bytes || *peer_copy_bytes >= 0, "transport_options: peer_copy_bytes=", *peer_copy_bytes,
                         " is not a size (an integer >= 0)");
             TORCH_CHECK(!message_bytes || *message_bytes > 0, "transport_options: message_bytes=", *message_bytes,
                         " is not a positive size");
             return scope;
           }),
           py::arg("transport"), py::arg("peer_memory"), py::arg("peer_copy_bytes"), py::arg("message_bytes"),
           py::arg("shared_arena"))
      .def("enter", &TransportScope::enter)
      .def("exit", &TransportScope::exit);
  m.def(
      "redistribute",
      [](const at::Tensor& t, const DeviceMesh& mesh, const EncodedPlacements& placements,
         const std::optional<EncodedSizes>& sizes, const std::optional<std::string>& transport, std::optional<bool> peer_memory) {
        return redistribute(t, mesh, decode_placements(placements), decode_optional(sizes), transport_options(transport, peer_memory));
      },
      py::arg("t"), py::arg("mesh"), py::arg("placements"), py::arg("sizes"), py::arg("transport") = py::none(),
      py::arg("peer_memory") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def(
      "distribute_tensor",
      [](const at::Tensor& global, const DeviceMesh& mesh, const EncodedPlacements& placements,
         const std::optional<EncodedSizes>& sizes, std::optional<int64_t> src_data_rank) {
        return distribute_tensor(global, mesh, decode_placements(placements), decode_optional(sizes), src_data_rank);
      },
      py::arg("tensor"), py::arg("mesh"), py::arg("placements"), py::arg("sizes"), py::arg("src_data_rank"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "scatter_tensor",
      [](const std::optional<at::Tensor>& tensor, int64_t src, const DeviceMesh& mesh, const EncodedPlacements& placements,
         bool requires_grad, const std::optional<std::vector<int64_t>>& global_shape, const py::object& dtype) {
        const std::optional<c10::ScalarType> expected = dtype.is_none() ? std::nullopt : std::optional(dtype_from(dtype));
        py::gil_scoped_release released;
        return scatter_tensor(tensor.value_or(at::Tensor()), src, mesh, decode_placements(placements), requires_grad,
                              global_shape, expected);
      },
      py::arg("tensor"), py::arg("src"), py::arg("mesh"), py::arg("placements"), py::arg("requires_grad"),
      py::arg("global_shape") = py::none(), py::arg("dtype") = py::none());

  // Load-balanced causal attention (shardtensor/context_parallel.h).
  m.def("zigzag_shard", &zigzag_shard, py::arg("t"), py::arg("mesh_dim"), py::arg("seq_dim"), py::call_guard<py::gil_scoped_release>());
  m.def("zigzag_unshard", &zigzag_unshard, py::arg("t"), py::arg("mesh_dim"), py::arg("seq_dim"),
        py::call_guard<py::gil_scoped_release>());
  m.def("zigzag_shard_sizes", &zigzag_shard_sizes, py::arg("length"), py::arg("ranks"));

  // Layout queries: no communication.
  m.def("placements", [](const at::Tensor& t) { return encode_placements(spec(t).placements()); }, py::arg("t"));
  m.def("mesh", [](const at::Tensor& t) { return spec(t).mesh(); }, py::arg("t"));
  m.def("shard_sizes", [](const at::Tensor& t) { return encode_sizes(spec(t).shard_sizes()); }, py::arg("t"));
  m.def("local_shape", [](const at::Tensor& t) { return spec(t).local_shape(); }, py::arg("t"));
  m.def("local_offsets", [](const at::Tensor& t) { return spec(t).local_offsets(); }, py::arg("t"));
  m.def("local_shape_at", [](const at::Tensor& t, const std::vector<int64_t>& coordinate) {
    return spec(t).local_shape(coordinate);
  });
  m.def("describe", &describe, py::arg("t"));
  m.def("layout_table", [](const at::Tensor& t) { return layout_table(spec(t)); }, py::arg("t"));
  m.def("visualize_sharding", [](const at::Tensor& t) { return visualize_sharding(spec(t)); }, py::arg("t"));
  m.def(
      "explain_redistribute",
      [](const at::Tensor& t, const EncodedPlacements& placements, const std::optional<EncodedSizes>& sizes,
         const std::optional<std::string>& transport, std::optional<bool> peer_memory) {
        const ShardTensorSpec& source = spec(t);
        ShardTensorSpec target(source.mesh(), decode_placements(placements), source.shape(), source.dtype(),
                               sizes ? decode_sizes(*sizes) : ShardSizes{});
        return explain_redistribute(source, target, transport_options(transport, peer_memory));
      },
      py::arg("t"), py::arg("placements"), py::arg("sizes"), py::arg("transport") = py::none(), py::arg("peer_memory") = py::none());

  // Factories: each rank allocates only its piece.
  m.def(
      "factory",
      [](const std::string& kind, std::vector<int64_t> shape, const DeviceMesh& mesh, const EncodedPlacements& placements,
         const py::object& dtype, bool requires_grad, const std::optional<EncodedSizes>& sizes, double value,
         std::optional<uint64_t> seed) {
        FactoryLayout layout{std::move(shape), mesh, decode_placements(placements),
                             c10::TensorOptions().dtype(dtype.is_none() ? c10::get_default_dtype_as_scalartype()
                                                                        : dtype_from(dtype)),
                             sizes ? decode_sizes(*sizes) : ShardSizes{}};
        py::gil_scoped_release no_gil;
        at::Tensor out;
        if (kind == "empty") out = empty(layout);
        else if (kind == "zeros") out = zeros(layout);
        else if (kind == "ones") out = ones(layout);
        else if (kind == "full") out = full(layout, value);
        else if (kind == "rand") out = rand(layout, seed);
        else if (kind == "randn") out = randn(layout, seed);
        else TORCH_CHECK_VALUE(false, "factory '", kind, "' is not one of empty, zeros, ones, full, rand, randn.");
        // A fresh leaf: requires_grad is set after filling, so the fill is not recorded.
        if (requires_grad) out.set_requires_grad(true);
        return out;
      },
      py::arg("kind"), py::arg("shape"), py::arg("mesh"), py::arg("placements"), py::arg("dtype"),
      py::arg("requires_grad"), py::arg("sizes"), py::arg("value"), py::arg("seed"));
  m.def("manual_seed", py::overload_cast<uint64_t>(&manual_seed), py::arg("seed"));
  m.def("manual_seed_over", py::overload_cast<uint64_t, const DeviceMesh&>(&manual_seed), py::arg("seed"), py::arg("mesh"),
        py::call_guard<py::gil_scoped_release>());

  // local_map: `fn` is a Python callable on local tensors, called once per call (not per op).
  m.def(
      "local_map",
      [](const py::function& fn, const std::vector<at::Tensor>& inputs,
         const std::vector<std::optional<EncodedPlacements>>& in_placements,
         const std::vector<EncodedPlacements>& out_placements) {
        std::vector<std::optional<Placements>> ins;
        for (const auto& p : in_placements) ins.push_back(decode_optional(p));
        std::vector<Placements> outs;
        for (const auto& p : out_placements) outs.push_back(decode_placements(p));
        LocalFunction local = [&fn](const std::vector<at::Tensor>& locals) {
          py::gil_scoped_acquire gil;
          return fn(locals).cast<std::vector<at::Tensor>>();
        };
        py::gil_scoped_release no_gil;
        return local_map(local, inputs, ins, outs);
      },
      py::arg("fn"), py::arg("inputs"), py::arg("in_placements"), py::arg("out_placements"));
}

}  // namespace shardtensor::python
