// checkpoint::load: every rank reads metadata.json, matches it with its state, and works out
// which saved boxes intersect the box each of its tensors holds. Then two passes over exactly
// those chunks (Note [Checksum chunks] in format.h):
//   1. validate: every referenced file exists and is long enough, and every chunk this rank
//      needs has its checksum; the ranks then agree (one all-gather of a failure record), so an
//      error is raised on every rank before any tensor is written;
//   2. copy: the same chunks are read again (from the page cache, usually), verified again,
//      and copied into the local tensors.
// Two passes keep memory at one read buffer instead of a staging copy of every local tensor.
// A file that changes between the passes raises in pass 2 on the ranks that read it.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>

#include "checkpoint/agreement.h"
#include "checkpoint/checksum.h"
#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "redistribute/boxes.h"
#include "shardtensor/checkpoint.h"
#include "shardtensor/shard_tensor.h"
#include "spec/sequence_order.h"
#include "util/strings.h"

namespace shardtensor::checkpoint {
namespace {

constexpr const char* kLoad = "checkpoint::load";
constexpr int64_t kReadBufferBytes = int64_t(64) << 20;

// What this rank writes into one tensor of the state.
struct Target {
  std::string name;
  const SavedTensor* saved = nullptr;
  size_t saved_index = 0;   // into Metadata::tensors
  at::Tensor dst;           // the local tensor (a ShardTensor's) or the plain tensor itself
  Box box;                  // the global index range dst holds
  enum class Fill { Read, Zero, One } fill = Fill::Read;  // Zero/One: a Partial term that is not coordinate 0
  std::vector<std::pair<size_t, Box>> reads;  // (saved box index, intersection with `box`)
};

// A failure, in a form every rank can turn into a message (kind kChecksum) or not (kOther).
enum FailureKind : int64_t { kNone = 0, kOther = 1, kChecksum = 2 };
struct Failure {
  int64_t kind = kNone;
  int64_t tensor = 0, box = 0, chunk = 0;
  std::string message;
};

std::string describe_chunk(const SavedTensor& t, size_t box_index, int64_t chunk) {
  const SavedBox& b = t.boxes[box_index];
  const int64_t element_size = static_cast<int64_t>(c10::elementSize(t.dtype));
  const ChunkGeometry g = chunk_geometry(b.box.shape, element_size, b.rows_per_chunk);
  return c10::str("'", t.name, "' (box at offsets [", join(b.box.offsets, ", "), "], shape [", join(b.box.shape, ", "), "]) in ",
                  b.file, ", chunk ", chunk, " at bytes [", b.begin + g.chunk_begin_row(chunk) * g.row_bytes, ", ",
                  b.begin + g.chunk_end_row(chunk) * g.row_bytes, ")");
}

class BoxReader {
 public:
  BoxReader(const std::string& dir, const Metadata& m) : dir_(dir), metadata_(m) {}

  // Every file that the boxes of `tensors` name exists and holds their byte ranges.
  void check_files(const std::vector<Target>& targets) {
    std::map<std::string, std::pair<int64_t, std::string>> needed;  // file -> (end, tensor that ends there)
    for (const Target& t : targets)
      for (const SavedBox& b : t.saved->boxes) {
        auto& [end, who] = needed[b.file];
        if (b.end > end) {
          end = b.end;
          who = t.name;
        }
      }
    for (const auto& [file, need] : needed) {
      const File& f = open(file);
      const int64_t size = f.size();
      TORCH_CHECK(size >= need.first, kLoad, ": ", f.path(), " is ", size, " bytes, but the checkpoint metadata places data of '",
                  need.second, "' up to byte ", need.first, ": the file is truncated.");
    }
  }

  // Reads the chunks of box `box_index` of saved tensor `tensor_index` that hold its rows
  // [row_begin, row_end) (box-relative), in pieces of at most one read buffer, verifying every
  // chunk. `consume(first_row, rows, bytes)` sees each verified piece. Returns a failure
  // instead of raising for a checksum mismatch, so that every rank can name it.
  template <typename Consume>
  Failure read_rows(size_t tensor_index, size_t box_index, int64_t row_begin, int64_t row_end, Consume&& consume) {
    const SavedTensor& t = metadata_.tensors[tensor_index];
    const SavedBox& b = t.boxes[box_index];
    const ChunkGeometry g = chunk_geometry(b.box.shape, static_cast<int64_t>(c10::elementSize(t.dtype)), b.rows_per_chunk);
    const int64_t chunk_bytes = g.rows_per_chunk * g.row_bytes;
    const int64_t chunks_per_piece = std::max<int64_t>(1, kReadBufferBytes / std::max<int64_t>(chunk_bytes, 1));
    const int64_t first = row_begin / g.rows_per_chunk, last = (row_end - 1) / g.rows_per_chunk + 1;
    const File& f = open(b.file);
    for (int64_t c0 = first; c0 < last; c0 += chunks_per_piece) {
      const int64_t c1 = std::min(last, c0 + chunks_per_piece);
      const int64_t r0 = g.chunk_begin_row(c0), r1 = g.chunk_end_row(c1 - 1);
      const int64_t bytes = (r1 - r0) * g.row_bytes;
      if (static_cast<int64_t>(buffer_.size()) < bytes) buffer_.resize(static_cast<size_t>(bytes));
      f.read_at(buffer_.data(), bytes, b.begin + r0 * g.row_bytes);
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t at = (g.chunk_begin_row(c) - r0) * g.row_bytes;
        const uint64_t found = xxh64(buffer_.data() + at, static_cast<size_t>((g.chunk_end_row(c) - g.chunk_begin_row(c)) * g.row_bytes));
        if (found != b.chunk_checksums[c]) {
          Failure fail{kChecksum, static_cast<int64_t>(tensor_index), static_cast<int64_t>(box_index), c, ""};
          fail.message = c10::str(kLoad, ": checksum mismatch in ", describe_chunk(t, box_index, c), ": expected xxh64 ",
                                  to_hex(b.chunk_checksums[c]), ", found ", to_hex(found), ". The file is corrupt.");
          return fail;
        }
      }
      consume(r0, r1 - r0, buffer_.data());
    }
    return {};
  }

 private:
  const File& open(const std::string& file) {
    auto it = files_.find(file);
    if (it == files_.end()) it = files_.emplace(file, File::open_read(dir_ + "/" + file)).first;
    return it->second;
  }

  std::string dir_;
  const Metadata& metadata_;
  std::map<std::string, File> files_;
  std::vector<char> buffer_;
};

// Copies the part of `inter` that lies in rows [row0, row0 + rows) of saved box `saved`
// (held row-major in `bytes`) into `dst`, which holds the global box `dst_box`.
void copy_rows(const at::Tensor& dst, const Box& dst_box, const Box& saved, const Box& inter, c10::ScalarType dtype,
               int64_t row0, int64_t rows, char* bytes) {
  const auto options = at::TensorOptions().dtype(dtype);
  if (saved.shape.empty()) {  // 0-d
    dst.copy_(at::from_blob(bytes, {}, options));
    return;
  }
  std::vector<int64_t> shape = saved.shape;
  shape[0] = rows;
  const at::Tensor piece = at::from_blob(bytes, shape, options);
  const int64_t g0 = std::max(inter.offsets[0], saved.offsets[0] + row0);
  const int64_t g1 = std::min(inter.offsets[0] + inter.shape[0], saved.offsets[0] + row0 + rows);
  if (g1 <= g0) return;
  at::Tensor src = piece.narrow(0, g0 - saved.offsets[0] - row0, g1 - g0);
  at::Tensor out = dst.narrow(0, g0 - dst_box.offsets[0], g1 - g0);
  for (size_t d = 1; d < shape.size(); ++d) {
    src = src.narrow(static_cast<int64_t>(d), inter.offsets[d] - saved.offsets[d], inter.shape[d]);
    out = out.narrow(static_cast<int64_t>(d), inter.offsets[d] - dst_box.offsets[d], inter.shape[d]);
  }
  out.copy_(src);
}

// Rows [begin, end) of saved box `saved` that `inter` needs, box-relative.
std::pair<int64_t, int64_t> needed_rows(const Box& saved, const Box& inter) {
  if (saved.shape.empty()) return {0, 1};
  return {inter.offsets[0] - saved.offsets[0], inter.offsets[0] - saved.offsets[0] + inter.shape[0]};
}

Target target_for(const std::string& name, const at::Tensor& t) {
  Target target;
  target.name = name;
  if (is_shard_tensor(t)) {
    const ShardTensorSpec& sp = spec(t);
    const std::vector<int64_t>& coordinate = sp.mesh().coordinate();
    target.dst = to_local(t);  // grad mode is off: the stored local tensor itself
    target.box = has_zigzag(sp) ? Box::none() : box_of(sp, coordinate);  // zigzag: targets_for cuts it
    // A Partial target gets the value on coordinate 0 and the identity elsewhere for sum and
    // product, the value everywhere for avg, max and min (as distribute_tensor does).
    for (size_t m = 0; m < sp.placements().size(); ++m) {
      const Placement& p = sp.placements()[m];
      if (!p.is_partial() || coordinate[m] == 0) continue;
      if (p.reduce_op == ReduceOp::Sum || p.reduce_op == ReduceOp::Norm) target.fill = Target::Fill::Zero;
      else if (p.reduce_op == ReduceOp::Product && target.fill == Target::Fill::Read) target.fill = Target::Fill::One;
    }
  } else {
    target.dst = t;
    target.box = Box{std::vector<int64_t>(t.dim(), 0), t.sizes().vec()};
  }
  return target;
}

// The targets of `t`: one, but for a tensor split in zigzag order, whose piece is stretches of
// the dims so split: one target per stretch, each a view of the piece over its own box.
std::vector<Target> targets_for(const std::string& name, const at::Tensor& t) {
  const Target whole = target_for(name, t);
  if (!is_shard_tensor(t) || !has_zigzag(spec(t))) return {whole};
  std::vector<Target> targets;
  for (const Stretch& s : stretches_of(spec(t), spec(t).mesh().coordinate())) {
    Target piece = whole;
    piece.box = s.global;
    for (int64_t d = 0; d < piece.dst.dim(); ++d) piece.dst = piece.dst.narrow(d, s.local_start[d], s.global.shape[d]);
    targets.push_back(std::move(piece));
  }
  return targets;
}

// Pass 0 (metadata) and pass 1 (validate): no tensor is written.
std::vector<Target> validate(StateDict& state, const std::string& dir, const LoadOptions& options, Metadata& metadata,
                             LoadResult& result, std::unique_ptr<BoxReader>& reader, Failure& failure) {
  const std::string path = dir + "/" + kMetadataFile;
  TORCH_CHECK(path_exists(path), kLoad, ": no checkpoint at ", dir, ": ", kMetadataFile,
              " is missing. A save that did not finish leaves none (its staged ", dir, ".tmp-* directory is not loadable).");
  metadata = parse_metadata(read_small_file(path), path);

  for (const auto& [name, t] : state)
    if (!metadata.find(name)) result.missing_keys.push_back(name);
  for (const SavedTensor& s : metadata.tensors)
    if (!state.count(s.name)) result.unexpected_keys.push_back(s.name);
  TORCH_CHECK(!options.strict || (result.missing_keys.empty() && result.unexpected_keys.empty()), kLoad, ": the state and the checkpoint at ",
              dir, " hold different keys: missing from the checkpoint: [", join(result.missing_keys, ", "),
              "]; in the checkpoint but not in the state: [", join(result.unexpected_keys, ", "),
              "]. Pass LoadOptions with strict = false to load the common keys only.");

  std::vector<Target> targets;
  for (auto& [name, t] : state) {
    const SavedTensor* saved = metadata.find(name);
    if (!saved) continue;
    TORCH_CHECK(t.defined(), kLoad, ": '", name, "' in the state is an undefined tensor.");
    TORCH_CHECK(t.scalar_type() == saved->dtype, kLoad, ": '", name, "' has dtype ", c10::toString(saved->dtype),
                " in the checkpoint but ", c10::toString(t.scalar_type()), " in the state. Convert one of them first.");
    TORCH_CHECK(t.sizes().vec() == saved->shape, kLoad, ": '", name, "' has shape [", join(saved->shape, ", "),
                "] in the checkpoint but [", join(t.sizes(), ", "), "] in the state.");
    for (Target& target : targets_for(name, t)) {
      target.saved = saved;
      target.saved_index = static_cast<size_t>(saved - metadata.tensors.data());
      if (target.fill == Target::Fill::Read && target.box.numel() > 0)
        for (size_t i = 0; i < saved->boxes.size(); ++i) {
          const Box inter = intersect(target.box, saved->boxes[i].box);
          if (inter.numel() > 0) target.reads.emplace_back(i, inter);
        }
      targets.push_back(std::move(target));
    }
  }

  reader = std::make_unique<BoxReader>(dir, metadata);
  reader->check_files(targets);
  for (const Target& t : targets)
    for (const auto& [box_index, inter] : t.reads) {
      const auto [r0, r1] = needed_rows(t.saved->boxes[box_index].box, inter);
      failure = reader->read_rows(t.saved_index, box_index, r0, r1, [](int64_t, int64_t, char*) {});
      if (failure.kind != kNone) return targets;
    }
  return targets;
}

}  // namespace

LoadResult load(StateDict& state, const std::string& dir, const LoadOptions& options) {
  const Agreement group = Agreement::for_state(kLoad, state, options.mesh);
  at::NoGradGuard no_grad;
  Metadata metadata;
  LoadResult result;
  std::unique_ptr<BoxReader> reader;
  Failure failure;
  std::vector<Target> targets;
  try {
    targets = validate(state, dir, options, metadata, result, reader, failure);
  } catch (const c10::Error& e) {
    failure = Failure{kOther, 0, 0, 0, e.what_without_backtrace()};
  }

  // The one communication: every rank's failure record, so all raise before any write.
  const auto rows = group.gather({failure.kind, failure.tensor, failure.box, failure.chunk});
  const std::string untouched = " Nothing was loaded: the state is as it was.";
  if (failure.kind != kNone) TORCH_CHECK(false, failure.message, untouched);
  for (size_t p = 0; p < rows.size(); ++p) {
    const auto& row = rows[p];
    if (row[0] == kChecksum && row[1] < static_cast<int64_t>(metadata.tensors.size()))
      TORCH_CHECK(false, kLoad, ": checksum mismatch in ", describe_chunk(metadata.tensors[row[1]], row[2], row[3]),
                  ", found by rank ", group.ranks()[p], ". The file is corrupt.", untouched);
    TORCH_CHECK(row[0] == kNone, kLoad, ": rank ", group.ranks()[p], " could not validate the checkpoint at ", dir,
                " (its error says why).", untouched);
  }

  // Pass 2: write the tensors.
  for (const Target& t : targets) {
    if (t.fill == Target::Fill::Zero) t.dst.zero_();
    if (t.fill == Target::Fill::One) t.dst.fill_(1);
    for (const auto& [box_index, inter] : t.reads) {
      const Box& saved = t.saved->boxes[box_index].box;
      const auto [r0, r1] = needed_rows(saved, inter);
      const Failure again = reader->read_rows(t.saved_index, box_index, r0, r1, [&](int64_t row0, int64_t rows_n, char* bytes) {
        copy_rows(t.dst, t.box, saved, inter, t.saved->dtype, row0, rows_n, bytes);
      });
      TORCH_CHECK(again.kind == kNone, again.message, " It changed while loading: some tensors of the state were already written.");
    }
  }
  return result;
}

}  // namespace shardtensor::checkpoint
