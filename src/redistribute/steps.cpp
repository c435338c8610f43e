// See steps.h.
#include "redistribute/steps.h"

#include <c10/util/Exception.h>

#include <sstream>
#include <type_traits>

namespace shardtensor {
namespace {

const char* ring_name(RingPhase phase) {
  switch (phase) {
    case RingPhase::Pass: return "RingPass";
    case RingPhase::GradientPass: return "RingGradientPass";
    case RingPhase::Return: return "RingReturn";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown RingPhase");
}

}  // namespace

std::string to_string(const MoveStep& step) {
  std::ostringstream os;
  if (auto* s = std::get_if<AllReduceStep>(&step)) {
    os << "AllReduce(mesh_dim=" << s->mesh_dim << ", " << to_string(s->op) << ")";
  } else if (auto* s = std::get_if<ReduceScatterStep>(&step)) {
    os << "ReduceScatter(mesh_dim=" << s->mesh_dim << ", tensor_dim=" << s->tensor_dim << ", " << to_string(s->op) << ")";
  } else if (auto* s = std::get_if<AllGatherStep>(&step)) {
    os << "AllGather(mesh_dim=" << s->mesh_dim << ", tensor_dim=" << s->tensor_dim << ")";
  } else if (auto* s = std::get_if<AllToAllStep>(&step)) {
    os << "AllToAll(mesh_dim=" << s->mesh_dim << ", tensor_dim=" << s->from_dim << "->" << s->to_dim << ")";
  } else if (auto* s = std::get_if<LocalChunkStep>(&step)) {
    os << "LocalChunk(mesh_dim=" << s->mesh_dim << ", tensor_dim=" << s->tensor_dim << ")";
  } else if (std::holds_alternative<ExchangeStep>(step)) {
    os << "Exchange()";
  } else if (auto* s = std::get_if<HaloGatherStep>(&step)) {
    os << "HaloGather(mesh_dim=" << s->mesh_dim << ", tensor_dim=" << s->tensor_dim
       << (s->skipped_where_kept ? ", none where the forward kept the rows it received" : "") << ")";
  } else if (auto* s = std::get_if<HaloScatterAddStep>(&step)) {
    os << "HaloScatterAdd(mesh_dim=" << s->mesh_dim << ", tensor_dim=" << s->tensor_dim << ")";
  } else if (auto* s = std::get_if<RingStep>(&step)) {
    os << ring_name(s->phase) << "(mesh_dim=" << s->mesh_dim << ", tensor_dim=" << s->tensor_dim
       << (s->batches == 1 ? "" : ", batches=" + std::to_string(s->batches)) << ")";
  } else {
    os << "StatisticsGather(mesh_dim=" << std::get<StatisticsGatherStep>(step).mesh_dim << ")";
  }
  return os.str();
}

const char* counted_as(RingPhase phase) {
  switch (phase) {
    case RingPhase::Pass: return "ring_send_recv";
    case RingPhase::GradientPass: return "ring_gradients";
    case RingPhase::Return: return "ring_return";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown RingPhase");
}

const char* counted_as(const MoveStep& step) {
  if (std::holds_alternative<AllReduceStep>(step)) return "all_reduce";
  if (std::holds_alternative<AllGatherStep>(step) || std::holds_alternative<StatisticsGatherStep>(step)) return "all_gather";
  if (std::holds_alternative<ReduceScatterStep>(step)) return "reduce_scatter";
  if (auto* s = std::get_if<RingStep>(&step)) return counted_as(s->phase);
  return "all_to_all";  // AllToAll, Exchange and the halo's exchanges (LocalChunk moves nothing)
}

int64_t batches_of(const MoveStep& step) {
  const auto* ring = std::get_if<RingStep>(&step);
  return ring ? ring->batches : 1;
}

int64_t mesh_dim_of(const MoveStep& step) {
  return std::visit(
      [](const auto& s) -> int64_t {
        if constexpr (std::is_same_v<std::decay_t<decltype(s)>, ExchangeStep>) {
          return -1;
        } else {
          return s.mesh_dim;
        }
      },
      step);
}

std::optional<int64_t> starts_sharding(const MoveStep& step) {
  if (auto* s = std::get_if<ReduceScatterStep>(&step)) return s->tensor_dim;
  if (auto* s = std::get_if<AllToAllStep>(&step)) return s->to_dim;
  if (auto* s = std::get_if<LocalChunkStep>(&step)) return s->tensor_dim;
  return std::nullopt;
}

bool is_redistribute_step(const MoveStep& step) { return step.index() <= MoveStep(ExchangeStep{}).index(); }

bool is_halo_step(const MoveStep& step) {
  return std::holds_alternative<HaloGatherStep>(step) || std::holds_alternative<HaloScatterAddStep>(step);
}

}  // namespace shardtensor
