// explain_operator (shardtensor/dispatch.h): a propagation printed, without running the op.
#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>
#include <sstream>

#include "dispatch/propagation.h"
#include "redistribute/transport.h"
#include "rules/kernel_plan.h"
#include "shardtensor/dispatch.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

std::string sizes_of(const ShardSizes& sizes) {
  std::string out;
  for (const DimShardSizes& entry : sizes) out += " dim " + std::to_string(entry.tensor_dim) + " sizes [" + join(entry.sizes, ", ") + "]";
  return out;
}

// How a kernel's halo moves travel under the options in force: what the kernel's exchange
// asks for (redistribute/transport.h: exchange_transport). Whether the group's ranks share a
// host is known only once they have compared notes, which explain does not do: both cases are
// named.
std::string halo_transport(const DeviceMesh& mesh) {
  const ResolvedTransportOptions options = resolve();
  const bool on_cpu = mesh.device_type() == "cpu";
  const StepTransport widest = exchange_transport(mesh, std::numeric_limits<int64_t>::max(), on_cpu, "all_to_all", options);
  if (widest.kind != TransportKind::PeerMemory && widest.kind != TransportKind::SharedArena)
    return widest.kind == TransportKind::Messages ? "messages" : "one all_to_all";
  std::string how = to_string(widest) + " where the ranks share a host, else messages";
  if (options.peer_copy_bytes > 0)
    how += " (from " + std::to_string(options.peer_copy_bytes) + " bytes per rank; below, one all_to_all)";
  return how;
}

}  // namespace

std::string explain_operator(const std::string& op_name, std::vector<c10::IValue> args) {
  const size_t dot = op_name.find('.');
  const std::string name = op_name.substr(0, dot), overload = dot == std::string::npos ? "" : op_name.substr(dot + 1);
  const auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(handle.has_value(), "explain_operator: no operator '", op_name, "' (write it as \"aten::convolution\" or ",
              "\"aten::add.Tensor\": namespace, name and overload)");
  const c10::FunctionSchema& schema = handle->schema();
  TORCH_CHECK(args.size() <= schema.arguments().size(), "explain_operator: ", op_name, " takes ", schema.arguments().size(),
              " arguments, got ", args.size());
  for (size_t i = args.size(); i < schema.arguments().size(); ++i) {
    const auto& fallback = schema.arguments()[i].default_value();
    TORCH_CHECK(fallback.has_value(), "explain_operator: ", op_name, ": argument '", schema.arguments()[i].name(),
                "' has no default; pass it");
    args.push_back(*fallback);
  }
  const Propagation& p = propagate(*handle, args);

  std::ostringstream os;
  os << op_name << (p.fallback ? " (no sharding rule: falls back to gathering)" : "") << "\n";
  for (size_t k = 0; k < p.meta.inputs.size(); ++k) {
    const TensorInput& in = p.meta.inputs[k];
    os << "  input '" << schema.arguments()[in.arg_index].name() << "' " << to_string(in.spec.placements()) << ": "
       << (p.plans[k] ? "redistributed " + p.plans[k]->to_string() + " to " + to_string(p.result.input_targets[k].placements())
                      : std::string("used as it is"))
       << "\n";
  }
  if (p.result.kernel_plan) {
    os << "  kernel: " << p.result.kernel_plan->name() << "\n";
    // The moves the kernel runs, as dispatch lowered them for it (domain/kernel_moves.h).
    if (p.kernel_moves.empty()) os << "    moves nothing between ranks\n";
    for (const LoweredStep& lowered : p.kernel_moves.steps()) {
      const MoveStep& m = lowered.step();
      os << "    " << to_string(m) << (is_halo_step(m) ? ", by " + halo_transport(p.kernel_moves.mesh()) : "") << "\n";
    }
  } else {
    os << "  kernel: the operator on the local pieces\n";
  }
  for (size_t j = 0; j < p.result.outputs.size(); ++j)
    os << "  output " << j << ": " << to_string(p.result.outputs[j].placements) << sizes_of(p.result.outputs[j].sizes) << "\n";
  return os.str();
}

}  // namespace shardtensor
