// See agreement.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/agreement.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "comm/mesh_collectives.h"
#include "util/counter_random.h"

namespace shardtensor {
namespace {

std::atomic<bool>& checks_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("SHARDTENSOR_CHECK_AGREEMENT");
    return !(v && std::string(v) == "0");
  }()};
  return flag;
}

// The seed generation (counter_random.h) each mesh last checked, by mesh hash, and the torch
// seed each mesh last checked while keys follow torch's generator.
struct CheckedSeeds {
  std::mutex mutex;
  std::unordered_map<size_t, uint64_t> generation_of_mesh;
  std::unordered_map<size_t, uint64_t> torch_seed_of_mesh;
};
CheckedSeeds& checked_seeds() {
  static CheckedSeeds checked;
  return checked;
}

void check_seeds_agree(const DeviceMesh& mesh, uint64_t seed) {
  const AgreementRows rows = gather_rows(mesh, {static_cast<int64_t>(seed)});
  if (const auto r = first_row_differing(rows, 0)) {
    TORCH_CHECK_VALUE(false, "manual_seed: the ranks of ", mesh, " were given different seeds: global rank ", mesh.ranks()[0],
                " has ", static_cast<uint64_t>(rows[0][0]), " and global rank ", mesh.ranks()[*r], " has ",
                static_cast<uint64_t>(rows[*r][0]), ". A Replicate tensor would hold different values on different ranks; ",
                "pass every rank the same seed (not one derived from its rank).");
  }
}

// Keys follow torch's generator: ranks must have seeded it alike.
void check_torch_seeds_agree(const DeviceMesh& mesh, uint64_t seed) {
  const AgreementRows rows = gather_rows(mesh, {static_cast<int64_t>(seed)});
  if (const auto r = first_row_differing(rows, 0)) {
    TORCH_CHECK_VALUE(false, "random operator on a ShardTensor: the ranks of ", mesh, " seeded torch differently (torch.manual_seed): ",
                      "global rank ", mesh.ranks()[0], " has seed ", static_cast<uint64_t>(rows[0][0]), " and global rank ",
                      mesh.ranks()[*r], " has ", static_cast<uint64_t>(rows[*r][0]),
                      ". ShardTensor random operators draw from torch's generator, and a Replicate tensor would hold different "
                      "values on different ranks; seed every rank alike, or give shardtensor its own seed with "
                      "shardtensor.manual_seed(seed, mesh).");
  }
}

void mark_checked(const DeviceMesh& mesh, uint64_t generation) {
  CheckedSeeds& checked = checked_seeds();
  std::lock_guard<std::mutex> lock(checked.mutex);
  checked.generation_of_mesh[mesh.hash()] = generation;
}

}  // namespace

AgreementRows gather_rows(const DeviceMesh& mesh, const std::vector<int64_t>& row) {
  if (mesh.size() == 1) return {row};
  const at::Tensor mine = at::tensor(row, at::kLong).to(mesh.device());
  const at::Tensor all = all_gather_over_mesh(mesh, mine).cpu().contiguous();
  const int64_t* p = all.data_ptr<int64_t>();
  const size_t width = row.size();
  AgreementRows rows;
  for (int64_t r = 0; r < mesh.size(); ++r) rows.emplace_back(p + r * width, p + (r + 1) * width);
  return rows;
}

std::optional<int64_t> first_row_differing(const AgreementRows& rows, size_t column) {
  for (size_t r = 1; r < rows.size(); ++r)
    if (rows[r][column] != rows[0][column]) return static_cast<int64_t>(r);
  return std::nullopt;
}

std::vector<std::string> gather_texts(const DeviceMesh& mesh, const std::string& text) {
  constexpr size_t kWords = (kAgreementTextChars + 1) / sizeof(int64_t);
  std::vector<int64_t> words(kWords, 0);
  std::memcpy(words.data(), text.data(), std::min(text.size(), kAgreementTextChars));
  std::vector<std::string> texts;
  for (const std::vector<int64_t>& row : gather_rows(mesh, words)) {
    const char* chars = reinterpret_cast<const char*>(row.data());
    texts.emplace_back(chars, strnlen(chars, kAgreementTextChars));
  }
  return texts;
}

void check_rows_agree(const DeviceMesh& mesh, const AgreementRows& rows, size_t column, const std::string& what,
                      const std::function<std::string()>& what_i_read, const std::string& advice) {
  const auto r = first_row_differing(rows, column);
  if (!r) return;
  const std::vector<std::string> texts = gather_texts(mesh, what_i_read());
  TORCH_CHECK_VALUE(false, what, ": global rank ", mesh.ranks()[0], " read ", texts[0], " and global rank ", mesh.ranks()[*r], " read ",
              texts[*r], ". ", advice);
}

// Failure codes: the c10 error kinds that Python maps to their own exception types.
enum FailureCode : int64_t { kNone = 0, kError, kValueError, kIndexError, kTypeError, kNotImplementedError };

int64_t failure_code(const std::exception_ptr& failure) {
  if (!failure) return kNone;
  try {
    std::rethrow_exception(failure);
  } catch (const c10::ValueError&) {
    return kValueError;
  } catch (const c10::IndexError&) {
    return kIndexError;
  } catch (const c10::TypeError&) {
    return kTypeError;
  } catch (const c10::NotImplementedError&) {
    return kNotImplementedError;
  } catch (...) {
    return kError;
  }
}

void raise_where_any_rank_failed(const DeviceMesh& mesh, const AgreementRows& rows, size_t failed_column,
                                 const std::exception_ptr& mine) {
  int64_t failed = -1;
  for (size_t r = 0; r < rows.size() && failed < 0; ++r)
    if (rows[r][failed_column] != kNone) failed = static_cast<int64_t>(r);
  if (failed < 0) return;
  // Where every rank failed, each knows its own reason: raise it without fetching another's text
  // (every rank sees the same rows, so all take this branch or none).
  const bool all_failed = std::all_of(rows.begin(), rows.end(), [&](const std::vector<int64_t>& row) { return row[failed_column] != kNone; });
  if (mine && all_failed) std::rethrow_exception(mine);
  std::string my_message;
  if (mine) {
    try {
      std::rethrow_exception(mine);
    } catch (const c10::Error& e) {
      my_message = e.what_without_backtrace();
    }
  }
  const std::string theirs = gather_texts(mesh, my_message)[failed];  // every rank joins, then raises
  if (mine) std::rethrow_exception(mine);
  const auto message = c10::str(theirs, " [raised on global rank ", mesh.ranks()[failed], "; every rank of ", mesh,
                                " raises with it]");
  switch (rows[failed][failed_column]) {
    case kValueError: TORCH_CHECK_VALUE(false, message);
    case kIndexError: TORCH_CHECK_INDEX(false, message);
    case kTypeError: TORCH_CHECK_TYPE(false, message);
    case kNotImplementedError: TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    default: TORCH_CHECK(false, message);
  }
}

bool agreement_checks_enabled() { return checks_flag().load(std::memory_order_relaxed); }
void set_agreement_checks_enabled(bool enabled) { checks_flag() = enabled; }

void seed_checked_over(const DeviceMesh& mesh, uint64_t seed) {
  if (mesh.size() > 1 && mesh.includes_this_rank()) check_seeds_agree(mesh, seed);  // outside: no one to check with
  set_random_seed(seed);
  mark_checked(mesh, random_seed_state().generation);
}

uint64_t next_random_key_on(const DeviceMesh& mesh) {
  const SeedState seeded = random_seed_state();
  // Outside the mesh there is no one to check with; the key is drawn all the same.
  if (mesh.size() > 1 && seeded.generation == 0 && agreement_checks_enabled() && mesh.includes_this_rank()) {
    // Keys follow torch's generator: the first draw on each mesh after torch's seed changed checks it.
    const uint64_t seed = torch_generator_seed();
    bool checked_already;
    {
      CheckedSeeds& checked = checked_seeds();
      std::lock_guard<std::mutex> lock(checked.mutex);
      auto it = checked.torch_seed_of_mesh.find(mesh.hash());
      checked_already = it != checked.torch_seed_of_mesh.end() && it->second == seed;
    }
    if (!checked_already) {
      check_torch_seeds_agree(mesh, seed);  // a collective: it raises on every rank alike
      CheckedSeeds& checked = checked_seeds();
      std::lock_guard<std::mutex> lock(checked.mutex);
      checked.torch_seed_of_mesh[mesh.hash()] = seed;
    }
  }
  if (mesh.size() > 1 && seeded.generation > 0 && agreement_checks_enabled() && mesh.includes_this_rank()) {
    bool checked_already;
    {
      CheckedSeeds& checked = checked_seeds();
      std::lock_guard<std::mutex> lock(checked.mutex);
      checked_already = checked.generation_of_mesh[mesh.hash()] == seeded.generation;
    }
    if (!checked_already) {
      check_seeds_agree(mesh, seeded.seed);  // a collective: it raises on every rank alike
      mark_checked(mesh, seeded.generation);
    }
  }
  return next_random_key();
}

}  // namespace shardtensor
