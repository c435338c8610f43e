// Redistribution benchmark: each transition next to the raw c10d collective that moves the
// minimal bytes, measured in the same run, plus planning time.
//
//   shardrun -n 4 ./build/bench/redistribute_bench        (also -n 2; --planning-only: just planning;
//                                                        --only S(0)->R: matching transitions;
//                                                        --small: small tensors, see small_transfers();
//                                                        --runs N: timed runs per figure (61);
//                                                        --json FILE: min / median / max as JSON)
//
// Every row also reports the copy floor (copy_floor.h): the same result made by plain copies
// among pieces that all ranks map, timed in the same turns; and one empty exchange: what any
// transport pays to learn that its peers' pieces are ready and that they are done with its own,
// which the floor program leaves out.
//
// Tensors: 16 MiB of float ([2048, 2048], even) and an awkward [2047, 2049] (uneven). Each
// figure is the median of 61 runs after 3 warm-ups, with a barrier before every run; a run
// lasts from the first rank's start to the last rank's end (run_ms); a transition and its raw
// collectives run in turns. Rank 0 prints a Markdown table (and with --json writes every
// figure's min, median and max over the runs to FILE, for bench/regenerate.py).
#include <ATen/ATen.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>

#include "bench_report.h"
#include "copy_floor.h"
#include "comm/comm.h"
#include "comm/fingerprint.h"
#include "redistribute/boxes.h"
#include "redistribute/transports/peer_memory/copies.h"
#include "redistribute/plan.h"
#include "redistribute/transports/part_transport.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;
using Clock = std::chrono::steady_clock;
using bench_report::Stats;

namespace {

constexpr int kWarmup = 3;
int runs = 61;  // --runs N

// One run of fn, in milliseconds, two ways. `slowest`: the longest of the ranks' own durations,
// each from its leaving the barrier to its result. `span`: from the first rank's start to the
// last rank's end. They differ where ranks share cores: a program whose ranks do not wait for
// each other (the copy floor) then has ranks that only start once another has finished, and its
// slowest duration is less than the copying all of them together need; the span counts that,
// and also how far apart the ranks leave the barrier. The ranks of one host read the same steady
// clock (CLOCK_MONOTONIC), which is where this program runs them.
struct RunMs {
  double slowest, span;
};
RunMs run_ms(const DeviceMesh& mesh, const std::function<void()>& fn) {
  const auto ms_of = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(t.time_since_epoch()).count(); };
  mesh.mesh_comm().barrier();
  const auto start = Clock::now();
  fn();
  const auto end = Clock::now();
  at::Tensor t = at::tensor(std::vector<double>{ms_of(end) - ms_of(start), -ms_of(start), ms_of(end)}, at::kDouble);
  mesh.mesh_comm().all_reduce(t, ReduceOp::Max);  // the longest duration, -(first start), last end
  return {t[0].item<double>(), t[1].item<double>() + t[2].item<double>()};
}

// The median run of each of `fns`, taken in turns (fns[0], fns[1], ..., fns[0], ...) so that
// the machine's slow spells hit them alike: with ranks sharing 2 cores, separate timing loops
// drifted apart by up to 30%.
// The raw collectives (fns[1...]) run as bare c10d runs them: without shardtensor's fingerprint
// check, which shardtensor's own transfers (fns[0]) pay on messages (fingerprint.h).
// `first_raw` says where the raw ones begin. Returns min, median and max over the runs of the
// slowest rank's durations (run_ms), and, in `spans` where given, of the runs' spans.
std::vector<Stats> time_ms(const DeviceMesh& mesh, const std::vector<std::function<void()>>& given, size_t first_raw = 1,
                           std::vector<Stats>* spans = nullptr) {
  std::vector<std::function<void()>> fns = given;
  for (size_t f = first_raw; f < fns.size(); ++f)
    fns[f] = [raw = given[f]] {
      const bool checked = message_fingerprints_enabled();
      set_message_fingerprints_enabled(false);
      raw();
      set_message_fingerprints_enabled(checked);
    };
  for (int i = 0; i < kWarmup; ++i)
    for (const auto& fn : fns) fn();
  std::vector<std::vector<double>> samples(fns.size()), span_samples(fns.size());
  for (int i = 0; i < runs; ++i)
    for (size_t f = 0; f < fns.size(); ++f) {
      const RunMs ms = run_ms(mesh, fns[f]);
      samples[f].push_back(ms.slowest);
      span_samples[f].push_back(ms.span);
    }
  std::vector<Stats> stats;
  for (const auto& s : samples) stats.push_back(bench_report::stats_of(s));
  if (spans) {
    spans->clear();
    for (const auto& s : span_samples) spans->push_back(bench_report::stats_of(s));
  }
  return stats;
}

struct Row {
  std::string name, raw_name;
  Stats ours, raw;
  Stats raw_with_own;  // the same collective also placing this rank's own part (Gloo copies it)
  Stats hand_written;  // the program one writes by hand around that collective (hand_written())
  Stats copies;        // the copies no program on contiguous messages avoids (copies_alone())
  Stats floor;         // the copy floor: the result copied out of pieces every rank maps (copy_floor.h)
  Stats one_exchange;  // redistribute's exchange of one element per rank (one_exchange())
  Stats ours_span, floor_span;  // the same runs as spans: first rank's start to last rank's end (run_ms)
  std::string raw_with_own_name = "all_to_all (minimal bytes, own part included)";
  bool exchange = false;  // hand_written and copies were timed
  double ours_ms() const { return ours.median; }
  double raw_ms() const { return raw.median; }
  double raw_with_own_ms() const { return raw_with_own.median; }
  double hand_written_ms() const { return hand_written.median; }
  double copies_ms() const { return copies.median; }
  double floor_ms() const { return floor.median; }
  double one_exchange_ms() const { return one_exchange.median; }
};

std::string only;  // --only SUBSTRING: just the transitions whose name contains it

// What this rank sends each peer and receives from each (in mesh.ranks() order, the order of
// the all_to_all's splits; Box::none() where nothing moves), in the source's coordinates.
// Its own part sits at index `own` of both.
struct PartsOfThisRank {
  std::vector<Box> sends, receives;
  size_t own = 0;
};

PartsOfThisRank parts_of_this_rank(const ShardTensorSpec& src, const ShardTensorSpec& dst) {
  const DeviceMesh& mesh = src.mesh();
  const auto me = mesh.coordinate();
  PartsOfThisRank parts;
  for (int64_t r : mesh.ranks()) {
    const auto peer = mesh.coordinate_of(r);
    if (peer == me) parts.own = parts.sends.size();
    parts.sends.push_back(feeds(src, me, peer) ? intersect(box_of(src, me), box_of(dst, peer)) : Box::none());
    parts.receives.push_back(feeds(src, peer, me) ? intersect(box_of(src, peer), box_of(dst, me)) : Box::none());
  }
  return parts;
}

bool moves_nothing(const Box& part) { return part.nothing || part.empty(); }

// The program one writes by hand with the raw collective, as DTensor's all_to_all path does:
// pack every rank's part (this rank's own included) into one send buffer, one all_to_all
// with split sizes, then place what arrived. Where the parts arrive in the output's own order
// (S(0)->S(1): row blocks of peers 0..n-1), it receives straight into the output, as a careful
// author would. The gap between the raw collective and this is what packing and placing cost.
std::function<void()> hand_written(const at::Tensor& x, const ShardTensorSpec& src, const ShardTensorSpec& dst) {
  const DeviceMesh& mesh = src.mesh();
  const auto me = mesh.coordinate();
  const at::Tensor local = to_local(x);
  const PartsOfThisRank parts = parts_of_this_rank(src, dst);
  return [=, &mesh] {
    std::vector<at::Tensor> packed;
    std::vector<int64_t> send_splits, recv_splits;
    for (const Box& part : parts.sends) {
      packed.push_back(moves_nothing(part) ? at::empty({0}) : view_of_part(local, box_of(src, me), part).reshape(-1));
      send_splits.push_back(packed.back().numel());
    }
    const at::Tensor out = at::empty(dst.local_shape());
    int64_t total = 0;
    bool in_order = true;  // each part lands right after the one before, contiguously
    for (const Box& part : parts.receives) {
      if (moves_nothing(part)) {
        recv_splits.push_back(0);
        continue;
      }
      const at::Tensor where = view_of_part(out, box_of(dst, me), part);
      in_order = in_order && where.is_contiguous() && where.data_ptr<float>() == out.data_ptr<float>() + total;
      recv_splits.push_back(part.numel());
      total += part.numel();
    }
    const at::Tensor recv = in_order ? out.view(-1) : at::empty({total});
    mesh.mesh_comm().all_to_all(recv, at::cat(packed), recv_splits, send_splits);
    if (in_order) return;
    int64_t offset = 0;
    for (const Box& part : parts.receives) {
      if (moves_nothing(part)) continue;
      view_of_part(out, box_of(dst, me), part).copy_(recv.narrow(0, offset, part.numel()).view(part.shape));
      offset += part.numel();
    }
  };
}

// The local copies that no program moving these parts as contiguous messages (Gloo's kind)
// can avoid, with no communication: pack each strided part it sends, unpack each strided part
// it receives (from a buffer standing in for the message), copy its own part into a fresh
// result. Where every core is busy (4 ranks on this 2-core VM) no copy hides behind a
// transfer, so the raw collective plus these copies is the floor of any such program.
std::function<void()> copies_alone(const at::Tensor& x, const ShardTensorSpec& src, const ShardTensorSpec& dst) {
  const auto me = src.mesh().coordinate();
  const at::Tensor local = to_local(x);
  const PartsOfThisRank parts = parts_of_this_rank(src, dst);
  std::vector<at::Tensor> arrived(parts.receives.size());  // what a strided part's message holds
  for (size_t r = 0; r < parts.receives.size(); ++r)
    if (!moves_nothing(parts.receives[r])) arrived[r] = at::rand(parts.receives[r].shape);
  return [=] {
    const at::Tensor out = at::empty(dst.local_shape());
    for (size_t r = 0; r < parts.sends.size(); ++r) {
      if (moves_nothing(parts.sends[r]) || r == parts.own) continue;
      (void)view_of_part(local, box_of(src, me), parts.sends[r]).contiguous();  // a no-op for row blocks
    }
    for (size_t r = 0; r < parts.receives.size(); ++r) {
      if (moves_nothing(parts.receives[r])) continue;
      const at::Tensor where = view_of_part(out, box_of(dst, me), parts.receives[r]);
      if (r == parts.own)
        where.copy_(view_of_part(local, box_of(src, me), parts.receives[r]));
      else if (!where.is_contiguous())
        where.copy_(arrived[r]);
    }
  };
}

// Row-major strides, in elements, of a tensor of `shape`.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

// The byte offset of `part`'s first element in a row-major tensor that covers `holds`.
size_t offset_in(const Box& holds, const Box& part) {
  const std::vector<int64_t> strides = strides_of(holds.shape);
  int64_t elements = 0;
  for (size_t d = 0; d < strides.size(); ++d) elements += (part.offsets[d] - holds.offsets[d]) * strides[d];
  return static_cast<size_t>(elements) * sizeof(float);
}

// The global tensor of `spec`'s shape whose every element is its row-major index mod 1024: its
// pieces and their sums over 4 ranks are exact in float, so the floor's result can be checked.
at::Tensor numbered(const ShardTensorSpec& spec) {
  return at::remainder(at::arange(c10::multiply_integers(spec.shape()), at::kFloat), 1024).view(spec.shape());
}

// The copy floor of `src` -> `dst` on a mesh whose ranks share this host: every rank's source
// piece and result in one shared mapping, and this rank's result made of plain copies of
// exactly the parts it needs (its own included, as redistribute's result holds it), or, from a
// pending sum, one summing pass over every rank's term. Its result is checked once, here.
std::function<void()> copy_floor_of(const ShardTensorSpec& src, const ShardTensorSpec& dst) {
  const DeviceMesh& mesh = src.mesh();
  const std::vector<int64_t>& ranks = mesh.ranks();
  const size_t n = ranks.size();
  std::vector<Box> holds(n), results(n);
  std::vector<size_t> in_at(n), out_at(n);
  size_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    holds[i] = box_of(src, mesh.coordinate_of(ranks[i]));
    in_at[i] = bytes;
    bytes += static_cast<size_t>(holds[i].numel()) * sizeof(float);
  }
  for (size_t i = 0; i < n; ++i) {
    results[i] = box_of(dst, mesh.coordinate_of(ranks[i]));
    out_at[i] = bytes;
    bytes += static_cast<size_t>(results[i].numel()) * sizeof(float);
  }
  const auto me = mesh.coordinate();
  const size_t self = static_cast<size_t>(std::find(ranks.begin(), ranks.end(), world_rank()) - ranks.begin());
  // One name per mapping, from rank 0's pid: rank 0 makes it, the others open it after a barrier.
  static int made = 0;
  at::Tensor pid = at::tensor(std::vector<int64_t>{mesh.rank() == 0 ? static_cast<int64_t>(getpid()) : 0});
  mesh.mesh_comm().all_reduce(pid, ReduceOp::Max);
  const std::string name = "/shardtensor-floor-" + std::to_string(pid.item<int64_t>()) + "-" + std::to_string(made++);
  std::shared_ptr<copy_floor::SharedMapping> mapping;
  if (mesh.rank() == 0) mapping = std::make_shared<copy_floor::SharedMapping>(name, bytes, true);
  mesh.mesh_comm().barrier();
  if (mesh.rank() != 0) mapping = std::make_shared<copy_floor::SharedMapping>(name, bytes, false);
  mesh.mesh_comm().barrier();
  if (mesh.rank() == 0) mapping->unlink();
  const at::Tensor global = numbered(src);
  const auto box_view = [](const at::Tensor& t, const Box& box) {
    at::Tensor v = t;
    for (int64_t d = 0; d < v.dim(); ++d) v = v.narrow(d, box.offsets[d], box.shape[d]);
    return v.contiguous();
  };
  const at::Tensor piece = box_view(global, holds[self]);
  std::memcpy(mapping->data() + in_at[self], piece.data_ptr<float>(), piece.nbytes());
  std::memset(mapping->data() + out_at[self], 0, static_cast<size_t>(results[self].numel()) * sizeof(float));  // touched once here

  std::vector<copy_floor::Stretch> stretches;
  const std::vector<int64_t> to_strides = strides_of(results[self].shape);
  if (src.has_partial()) {  // every rank holds a whole term: the result sums them, one pass
    std::vector<size_t> from;
    for (size_t i = 0; i < n; ++i) from.push_back(in_at[i] + offset_in(holds[i], results[self]));
    copy_floor::append_box(&stretches, results[self].shape, strides_of(holds[0].shape), from, to_strides, out_at[self], sizeof(float));
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (!feeds(src, mesh.coordinate_of(ranks[i]), me)) continue;
      const Box part = intersect(holds[i], results[self]);
      if (part.empty()) continue;
      copy_floor::append_box(&stretches, part.shape, strides_of(holds[i].shape), {in_at[i] + offset_in(holds[i], part)}, to_strides,
                             out_at[self] + offset_in(results[self], part), sizeof(float));
    }
  }
  mesh.mesh_comm().barrier();  // every piece written before any rank reads
  copy_floor::run(mapping->data(), stretches);
  const at::Tensor expected = box_view(src.has_partial() ? global * static_cast<double>(n) : global, results[self]);
  const at::Tensor got = at::from_blob(mapping->data() + out_at[self], expected.sizes(), at::kFloat);
  TORCH_CHECK(at::equal(got, expected), "copy floor of ", src, " -> ", dst, ": this rank's result is wrong");
  return [mapping, stretches] { copy_floor::run(mapping->data(), stretches); };
}

// One exchange through redistribute with (almost) nothing in it: S(0) -> R of a [ranks]
// tensor on a 1-D mesh of every rank, by the transport the options in force choose. Its time is
// the synchronization of an exchange plus how far apart the ranks leave the barrier before a
// run; the copy floor pays neither.
std::function<void()> one_exchange;

Row measure_exchange(const std::string& name, const ShardTensorSpec& src, const ShardTensorSpec& dst) {
  if (!only.empty() && name.find(only) == std::string::npos) return {name, "skipped"};
  const DeviceMesh& mesh = src.mesh();
  at::Tensor x = from_local(at::rand(src.local_shape()), mesh, src.placements(), ShardSizing::given(src.shard_sizes()));
  // Minimal bytes: what each receiver lacks, from the rank that holds it (boxes.h).
  const PartsOfThisRank parts = parts_of_this_rank(src, dst);
  std::vector<int64_t> send_splits, recv_splits;
  for (size_t i = 0; i < parts.sends.size(); ++i) {
    send_splits.push_back(i == parts.own || moves_nothing(parts.sends[i]) ? 0 : parts.sends[i].numel());
    recv_splits.push_back(i == parts.own || moves_nothing(parts.receives[i]) ? 0 : parts.receives[i].numel());
  }
  int64_t s = 0, r = 0;
  for (int64_t v : send_splits) s += v;
  for (int64_t v : recv_splits) r += v;
  at::Tensor send = at::rand({s}), recv = at::empty({r});
  // The same bytes on the wire, with this rank's own part in the buffers too, so that the
  // output is the whole result, as redistribute's is: the own part is a local copy in Gloo.
  const auto me = mesh.coordinate();
  const int64_t own = intersect(box_of(src, me), box_of(dst, me)).numel();
  std::vector<int64_t> send_splits_all = send_splits, recv_splits_all = recv_splits;
  send_splits_all[parts.own] = recv_splits_all[parts.own] = own;
  at::Tensor send_all = at::rand({s + own}), recv_all = at::empty({r + own});
  std::vector<Stats> spans;
  // The raw collectives: all_to_alls with exactly those sizes, buffers prepared in advance.
  const std::vector<Stats> ms = time_ms(mesh, {[&] { redistribute(x, dst.placements(), dst.shard_sizes()); }, one_exchange,
                                               [&] { mesh.mesh_comm().all_to_all(recv, send, recv_splits, send_splits); },
                                               [&] { mesh.mesh_comm().all_to_all(recv_all, send_all, recv_splits_all, send_splits_all); },
                                               hand_written(x, src, dst), copies_alone(x, src, dst), copy_floor_of(src, dst)},
                                        2, &spans);
  Row row{name, "all_to_all (minimal bytes)", ms[0], ms[2], ms[3], ms[4], ms[5], ms[6], ms[1], spans[0], spans[6]};
  row.exchange = true;
  return row;
}

// A reduction's row from time_ms over {ours, one_exchange, raw, [raw with its own part,] floor}
// and the same runs' spans.
Row reduction_row(const std::string& name, const std::string& raw_name, const std::vector<Stats>& ms, const std::vector<Stats>& spans) {
  Row row{name, raw_name, ms[0], ms[2], ms[ms.size() - 2]};
  row.one_exchange = ms[1];
  row.floor = ms.back();
  row.ours_span = spans[0];
  row.floor_span = spans.back();
  return row;
}

// "hand-written ms | ours / it | copies alone ms | ours / (raw + copies) |"
std::string hand_written_cells(const Row& r) {
  std::ostringstream cells;
  cells << std::fixed << std::setprecision(3) << r.hand_written_ms() << " | " << std::setprecision(2) << r.ours_ms() / r.hand_written_ms()
        << " | " << std::setprecision(3) << r.copies_ms() << " | " << std::setprecision(2) << r.ours_ms() / (r.raw_ms() + r.copies_ms())
        << " |";
  return cells.str();
}

void print(const std::vector<Row>& rows, int64_t world) {
  std::cout << "\n| transition (" << world << " ranks) | shardtensor ms | raw c10d | raw ms | ratio | raw ms, own part included | ratio "
            << "| hand-written ms (pack, all_to_all, place) | ratio | copies alone ms | ours / (raw + copies) | copy floor ms | ours / floor "
            << "| one empty exchange ms | ours / floor, as spans |\n"
            << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows)
    if (r.raw_name != "skipped")
      std::cout << "| " << r.name << " | " << std::fixed << std::setprecision(3) << r.ours_ms() << " | " << r.raw_name << " | "
              << r.raw_ms() << " | " << std::setprecision(2) << r.ours_ms() / r.raw_ms() << " | " << std::setprecision(3)
              << r.raw_with_own_ms() << " | " << std::setprecision(2) << r.ours_ms() / r.raw_with_own_ms() << " | "
              << (r.exchange ? hand_written_cells(r) : "(reduction: no hand-written program) | | | |") << " " << std::setprecision(3)
              << r.floor_ms() << " | " << std::setprecision(2) << r.ours_ms() / r.floor_ms() << " | " << std::setprecision(3)
              << r.one_exchange_ms() << " | " << std::setprecision(2) << r.ours_span.median / r.floor_span.median << " |\n";
}

// Min, median and max over 15 batches of the mean time per plan in a batch of `reps`.
Stats plan_us(const ShardTensorSpec& a, const ShardTensorSpec& b, bool cached, int reps, Planner planner = Planner::GraphSearch) {
  plan_redistribute(a, b, planner);
  std::vector<double> batches;
  for (int batch = 0; batch < 15; ++batch) {
    const auto start = Clock::now();
    for (int i = 0; i < reps; ++i) {
      if (cached) {
        volatile bool e = plan_redistribute(a, b, planner)->empty();
        (void)e;
      } else {
        volatile bool e = plan_redistribute_uncached(a, b, planner).empty();
        (void)e;
      }
    }
    batches.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / reps);
  }
  return bench_report::stats_of(batches);
}

// Small tensors (64 B to 128 KiB per rank): which transport should carry them. Peer memory (the
// default at every size) against the same redistribute over Gloo with its fingerprint round
// (what sizes under 256 KiB took before stop 37) and the raw c10d collective, unchecked.
void small_transfers(const DeviceMesh& mesh, const std::string& json_path) {
  const int64_t world = mesh.size(0);
  std::vector<std::string> lines;
  std::vector<bench_report::Object> json_rows;
  for (const std::vector<int64_t>& piece : std::vector<std::vector<int64_t>>{{4, 4}, {64, 64}, {128, 256}}) {
    const std::string bytes = std::to_string(piece[0] * piece[1] * 4) + " B";
    at::Tensor s0 = from_local(at::rand(piece), mesh, {Shard(0)}, ShardSizing::infer());
    at::Tensor p = from_local(at::rand(piece), mesh, {Partial()}, ShardSizing::given({}));
    at::Tensor gathered = at::empty({world, piece[0], piece[1]}), summed = at::rand(piece);
    const auto over_gloo = [](const std::function<void()>& fn) {
      return [fn] {
        TransportOptions no_peer_copies;
        no_peer_copies.peer_copy_bytes = std::numeric_limits<int64_t>::max();
        const TransportOptionsScope over_gloo_only(no_peer_copies);
        fn();
      };
    };
    const auto add = [&](const std::string& name, const std::function<void()>& ours, const std::string& raw_name, const std::function<void()>& raw) {
      const std::vector<Stats> stats = time_ms(mesh, {ours, over_gloo(ours), raw}, 2);
      const double ms[3] = {stats[0].median, stats[1].median, stats[2].median};
      std::ostringstream line;
      line << "| " << name << " | " << bytes << " | " << std::fixed << std::setprecision(3) << ms[0] << " | " << ms[1] << " | " << raw_name
           << " | " << ms[2] << " | " << std::setprecision(2) << ms[0] / ms[2] << " | " << ms[1] / ms[2] << " |";
      lines.push_back(line.str());
      json_rows.push_back(bench_report::Object()
                              .add("name", name)
                              .add("bytes", piece[0] * piece[1] * 4)
                              .add("raw_name", raw_name)
                              .add("peer_memory", stats[0])
                              .add("gloo_checked", stats[1])
                              .add("raw", stats[2]));
    };
    add("S(0)->R", [&] { redistribute(s0, {Replicate()}); }, "all_gather", [&] { mesh.comm(0).all_gather(summed, gathered); });
    // S(0)->S(1), even pieces: each rank sends every peer its rows of that peer's columns.
    const int64_t part = piece[0] * piece[1] / world, self = mesh.mesh_comm().rank();
    std::vector<int64_t> splits(world, part);
    splits[self] = 0;
    at::Tensor send = at::rand({part * (world - 1)}), recv = at::empty({part * (world - 1)});
    add("S(0)->S(1)", [&] { redistribute(s0, {Shard(1)}); }, "all_to_all", [&] { mesh.mesh_comm().all_to_all(recv, send, splits, splits); });
    add("P(sum)->R", [&] { redistribute(p, {Replicate()}); }, "all_reduce", [&] { mesh.comm(0).all_reduce(summed, ReduceOp::Sum); });
  }
  if (mesh.rank() != 0) return;
  std::cout << "\n| transition (" << world << " ranks) | bytes per rank | peer memory ms | Gloo, checked ms | raw c10d | raw ms | "
            << "peer memory / raw | Gloo / raw |\n|---|---|---|---|---|---|---|---|\n";
  for (const std::string& line : lines) std::cout << line << "\n";
  bench_report::write(json_path, bench_report::Object()
                                     .add("bench", "redistribute_bench --small")
                                     .add("world", world)
                                     .add("runs", runs)
                                     .add("small", json_rows));
}

bench_report::Object json_of(const Row& r) {
  bench_report::Object o;
  o.add("name", r.name).add("raw_name", r.raw_name).add("ours", r.ours).add("raw", r.raw);
  if (r.raw_with_own_name != "") o.add("raw_with_own_name", r.raw_with_own_name).add("raw_with_own", r.raw_with_own);
  if (r.exchange) o.add("hand_written", r.hand_written).add("copies", r.copies);
  o.add("floor", r.floor).add("one_exchange", r.one_exchange).add("ours_span", r.ours_span).add("floor_span", r.floor_span);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  // glibc hands large freed blocks back to the kernel, so every fresh 16 MiB result page-faults
  // again (~5 ms here), which the raw collectives, with buffers made in advance, never pay.
  // Keeping freed memory (as jemalloc or tcmalloc would) is the setting we recommend for
  // large-tensor processes (README, "Performance"); the same two values can be set with the
  // MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ environment variables.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  const bool planning_only = bench_report::flag(argc, argv, "--planning-only");
  const std::string json_path = bench_report::option(argc, argv, "--json");
  runs = bench_report::int_option(argc, argv, "--runs", runs);
  only = bench_report::option(argc, argv, "--only");
  if (bench_report::flag(argc, argv, "--small")) {
    small_transfers(DeviceMesh::create({world_size()}), json_path);
    return 0;
  }
  const int64_t world = world_size();
  DeviceMesh mesh = DeviceMesh::create({world});
  const at::Tensor tiny = distribute_tensor(at::rand({world}), mesh, {Shard(0)});
  one_exchange = [&] { redistribute(tiny, {Replicate()}); };
  std::vector<Row> rows;
  for (auto shape : planning_only ? std::vector<std::vector<int64_t>>{} : std::vector<std::vector<int64_t>>{{2048, 2048}, {2047, 2049}}) {
    const std::string tag = shape[0] == 2048 ? " even" : " uneven";
    ShardTensorSpec s0(mesh, {Shard(0)}, shape, c10::kFloat), s1(mesh, {Shard(1)}, shape, c10::kFloat),
        r(mesh, {Replicate()}, shape, c10::kFloat), p(mesh, {Partial()}, shape, c10::kFloat);
    rows.push_back(measure_exchange("S(0)->R" + tag, s0, r));
    rows.push_back(measure_exchange("S(0)->S(1)" + tag, s0, s1));
    // Partial: the raw baselines are all_reduce and an all_to_all of the reduce-scatter bytes.
    at::Tensor px = from_local(at::rand(shape), mesh, {Partial()}, ShardSizing::given({}));
    std::vector<Stats> spans;
    at::Tensor dense = at::rand(shape);
    const std::vector<Stats> to_replicate = time_ms(
        mesh, {[&] { redistribute(px, {Replicate()}); }, one_exchange, [&] { mesh.comm(0).all_reduce(dense, ReduceOp::Sum); }, copy_floor_of(p, r)},
        2, &spans);
    rows.push_back(reduction_row("P(sum)->R" + tag, "all_reduce", to_replicate, spans));
    rows.back().raw_with_own_name = "";  // the all_reduce's output is the whole result
    at::Tensor flat = at::rand({dense.numel()}), flat_out = at::empty({dense.numel()});
    std::vector<int64_t> splits;
    for (int64_t rows_of_piece : chunk_sizes(shape[0], world)) splits.push_back(rows_of_piece * shape[1]);
    std::vector<int64_t> recv(world, splits[mesh.coordinate()[0]]);
    at::Tensor recv_buf = at::empty({world * splits[mesh.coordinate()[0]]});
    // Gloo has no reduce-scatter: by hand it is this all_to_all, then a sum of the pieces
    // (the last column).
    const std::vector<Stats> to_shard = time_ms(mesh, {[&] { redistribute(px, {Shard(0)}); }, one_exchange,
                                                        [&] { mesh.comm(0).all_to_all(recv_buf, flat, recv, splits); },
                                                        [&] {
                                                          mesh.comm(0).all_to_all(recv_buf, flat, recv, splits);
                                                          at::sum(recv_buf.view({world, -1}), 0);
                                                        },
                                                        copy_floor_of(p, s0)},
                                                2, &spans);
    rows.push_back(reduction_row("P(sum)->S(0)" + tag, "all_to_all (reduce-scatter bytes)", to_shard, spans));
    rows.back().raw_with_own_name = "all_to_all, then the sum of the pieces (a reduce-scatter by hand)";
  }
  if (world == 4 && !planning_only) {
    ShardTensorSpec a(mesh, {Shard(0)}, {2048, 2048}, c10::kFloat, {{0, {256, 1024, 512, 256}}});
    ShardTensorSpec b(mesh, {Shard(0)}, {2048, 2048}, c10::kFloat, {{0, {512, 512, 512, 512}}});
    rows.push_back(measure_exchange("rebalance S(0) 1:4:2:1 -> even", a, b));
    DeviceMesh grid = DeviceMesh::create({2, 2});
    ShardTensorSpec nested(grid, {Shard(0), Shard(0)}, {2048, 2048}, c10::kFloat);
    ShardTensorSpec inner(grid, {Replicate(), Shard(0)}, {2048, 2048}, c10::kFloat);
    rows.push_back(measure_exchange("(S(0),S(0))->(R,S(0)) 2x2", nested, inner));
    ShardTensorSpec swap_a(grid, {Shard(0), Shard(1)}, {2048, 2048}, c10::kFloat);
    ShardTensorSpec swap_b(grid, {Shard(1), Shard(0)}, {2048, 2048}, c10::kFloat);
    rows.push_back(measure_exchange("(S(0),S(1))->(S(1),S(0)) 2x2", swap_a, swap_b));
    // Strided on both sides: every rank's part is 128 rows of 32 x 32 blocks.
    ShardTensorSpec last(mesh, {Shard(2)}, {256, 128, 128}, c10::kFloat), middle(mesh, {Shard(1)}, {256, 128, 128}, c10::kFloat);
    rows.push_back(measure_exchange("S(2)->S(1) [256, 128, 128]", last, middle));
  }
  if (mesh.rank() == 0) {
    if (!planning_only) print(rows, world);
    DeviceMesh one = DeviceMesh::without_comms({8}, 0), three = DeviceMesh::without_comms({2, 2, 2}, 0);
    ShardTensorSpec a1(one, {Shard(0)}, {1000, 64}, c10::kFloat), b1(one, {Shard(1)}, {1000, 64}, c10::kFloat);
    ShardTensorSpec a3(three, {Shard(0), Shard(1), Partial()}, {1000, 64, 8}, c10::kFloat);
    ShardTensorSpec b3(three, {Replicate(), Shard(0), Shard(2)}, {1000, 64, 8}, c10::kFloat);
    // DTensor's nested trap on a 3-D mesh: every mesh dim splits dim 0 -> only the last does.
    ShardTensorSpec n3(three, {Shard(0), Shard(0), Shard(0)}, {1000, 64, 8}, c10::kFloat);
    ShardTensorSpec m3(three, {Replicate(), Shard(1), Shard(0)}, {1000, 64, 8}, c10::kFloat);
    const std::vector<std::pair<std::string, Stats>> planning = {
        {"cached lookup, 1-D mesh(8)", plan_us(a1, b1, true, 20000)},
        {"cached lookup, 3-D mesh(2x2x2)", plan_us(a3, b3, true, 20000)},
        {"uncached greedy, 1-D mesh(8)", plan_us(a1, b1, false, 500, Planner::Greedy)},
        {"uncached greedy, 3-D mesh(2x2x2), plan A", plan_us(a3, b3, false, 500, Planner::Greedy)},
        {"uncached greedy, 3-D mesh(2x2x2), plan B", plan_us(n3, m3, false, 500, Planner::Greedy)},
        {"uncached graph search, 1-D mesh(8)", plan_us(a1, b1, false, 500)},
        {"uncached graph search, 3-D mesh(2x2x2), plan A", plan_us(a3, b3, false, 200)},
        {"uncached graph search, 3-D mesh(2x2x2), plan B", plan_us(n3, m3, false, 200)},
    };
    std::cout << "\n| planning | µs per plan |\n|---|---|\n";
    for (const auto& [what, us] : planning) std::cout << "| " << what << " | " << us.median << " |\n";
    std::cout << "\nPlan A, graph search: " << explain_redistribute(a3, b3, Planner::GraphSearch)
              << "\nPlan A, greedy:       " << explain_redistribute(a3, b3, Planner::Greedy)
              << "\nPlan B, graph search: " << explain_redistribute(n3, m3, Planner::GraphSearch)
              << "\nPlan B, greedy:       " << explain_redistribute(n3, m3, Planner::Greedy) << "\n";
    std::vector<bench_report::Object> json_rows, json_planning;
    for (const Row& r : rows)
      if (r.raw_name != "skipped") json_rows.push_back(json_of(r));
    for (const auto& [what, us] : planning) json_planning.push_back(bench_report::Object().add("name", what).add("us", us));
    bench_report::write(json_path, bench_report::Object()
                                       .add("bench", "redistribute_bench")
                                       .add("world", world)
                                       .add("runs", runs)
                                       .add("rows", json_rows)
                                       .add("planning", json_planning));
  }
  return 0;
}
