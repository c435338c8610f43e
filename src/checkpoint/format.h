// The on-disk format of a checkpoint directory, as values: the metadata (metadata.json), the
// dtype names, the chunking of boxes for checksums, and the plan of every rank's data file.
// Pure: no I/O and no communication, so every rank computes the same answers (rank 0 uses the
// plans of all ranks to write the metadata without reading their files).
//
// A checkpoint directory (docs/checkpoint.md, "Format", is the user-facing description):
//   rank-00003.safetensors  one per rank that writes a box; a standard safetensors file whose
//                           entries are named after the tensors; each entry is the box of that
//                           tensor this rank wrote (row-major, little-endian)
//   metadata.json           written last: format, version, chunk_bytes, and per tensor its
//                           dtype, global shape, the mesh and placements it was saved from, and
//                           its boxes (offsets, shape, file, absolute byte range, and one XXH64
//                           checksum per chunk)
//
// Note [Checksum chunks]: a box is checksummed in chunks of whole rows along tensor dim 0
// (rows_per_chunk = max(1, chunk_bytes / row_bytes); a 0-d box is one row of one element), so
// a loader that needs only some rows of a box reads and verifies only the chunks that hold
// them. A loader that needs some columns of every row reads the whole rows (the chunks cannot
// be cut inside a row): that is the read amplification of loading S(0)-saved data as S(1).
#pragma once

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "redistribute/boxes.h"
#include "shardtensor/spec.h"

namespace shardtensor::checkpoint {

constexpr const char* kFormatName = "shardtensor-checkpoint";
constexpr int64_t kFormatVersion = 1;
constexpr const char* kMetadataFile = "metadata.json";
constexpr int64_t kDefaultChunkBytes = int64_t(4) << 20;

// safetensors dtype names ("F32", "BF16", "I64", "BOOL"...). Raise for a dtype that
// safetensors cannot name (complex, quantized), naming `tensor`.
std::string safetensors_dtype(c10::ScalarType dtype, const std::string& tensor);
c10::ScalarType dtype_from_safetensors(const std::string& name, const std::string& what);
std::string rank_file_name(int64_t rank);  // "rank-00003.safetensors"

// How a box splits into checksum chunks (Note [Checksum chunks]).
struct ChunkGeometry {
  int64_t rows = 1;       // along tensor dim 0
  int64_t row_bytes = 0;
  int64_t rows_per_chunk = 1;
  int64_t num_chunks = 0;

  int64_t chunk_begin_row(int64_t chunk) const { return chunk * rows_per_chunk; }
  int64_t chunk_end_row(int64_t chunk) const { return std::min(rows, (chunk + 1) * rows_per_chunk); }
};
ChunkGeometry chunk_geometry(const std::vector<int64_t>& box_shape, int64_t element_size, int64_t rows_per_chunk);
int64_t rows_per_chunk_for(const std::vector<int64_t>& box_shape, int64_t element_size, int64_t chunk_bytes);

// ---- metadata.json ----
struct SavedBox {
  Box box;
  std::string file;
  int64_t begin = 0, end = 0;  // absolute byte range in `file`
  int64_t rows_per_chunk = 1;
  std::vector<uint64_t> chunk_checksums;
};

struct SavedTensor {
  std::string name;
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> shape;
  std::vector<int64_t> mesh_shape;  // empty for a plain tensor
  std::string placements;           // as printed ("[S(0), R]"); informational
  std::vector<SavedBox> boxes;      // tile the tensor; none when it has no elements
};

struct Metadata {
  int64_t version = kFormatVersion;
  int64_t world_size = 1;
  int64_t chunk_bytes = kDefaultChunkBytes;
  std::vector<SavedTensor> tensors;  // sorted by name

  const SavedTensor* find(const std::string& name) const;
};

// The text of metadata.json: one line of compact JSON, then a newline (Note [Version 1 JSON
// text] in json.h: the bytes are part of the format).
std::string metadata_text(const Metadata& metadata);
// Parses and validates the text of metadata.json: the format name, a version this build reads
// (a newer one raises saying so), and every field's kind. `source` names the file in messages.
Metadata parse_metadata(const std::string& text, const std::string& source);

// Raises, naming `api`, unless `name` can name a tensor in a checkpoint: not empty, not
// safetensors' "__metadata__", and valid UTF-8 (it is a key in JSON text).
void check_tensor_name(const std::string& name, const char* api);

// ---- the plan of every rank's data file ----
// One tensor of the state as save sees it, the same on every rank.
struct TensorToSave {
  std::string name;
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> shape;
  std::optional<ShardTensorSpec> spec;  // Partial already turned Replicate; nullopt: a plain tensor
};

struct PlannedEntry {
  size_t tensor = 0;  // index into the TensorToSave list
  Box box;
  int64_t begin = 0, end = 0;  // absolute byte range in the file
  ChunkGeometry chunks;
};

struct RankFilePlan {
  int64_t rank = 0;
  std::string file;
  std::string header;  // safetensors header JSON, padded with spaces to a multiple of 8 bytes
  std::vector<PlannedEntry> entries;
  int64_t num_chunks() const;
};

// Which global rank writes which box (Note [One writer per box] in format.cpp), and where it
// goes in its file. `ranks` are the global ranks of the group; `plain_writer` writes plain
// tensors. Ranks that write nothing get no plan.
std::vector<RankFilePlan> plan_files(const std::vector<TensorToSave>& tensors, const std::vector<int64_t>& ranks,
                                     int64_t plain_writer, int64_t chunk_bytes);

}  // namespace shardtensor::checkpoint
