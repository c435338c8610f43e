// Ranks agreeing on small metadata before any byte moves.
//
// Some arguments are read by each rank alone: from_local's sizes, distribute_tensor's shape and
// dtype, a seed. A user's mistake can make them differ between ranks, and moving bytes on such
// a disagreement ends in a backend abort or in wrong values. So each rank puts what it read
// into a short row of int64, the rows are all-gathered over the mesh (one small collective),
// and every rank compares every row: all of them raise the same error, or none does.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardtensor/device_mesh.h"

namespace shardtensor {

using AgreementRows = std::vector<std::vector<int64_t>>;

// Every rank's `row` (one length on every rank), in row-major mesh order.
AgreementRows gather_rows(const DeviceMesh& mesh, const std::vector<int64_t>& row);

// The first row (mesh order) whose `column` differs from row 0's, if any.
std::optional<int64_t> first_row_differing(const AgreementRows& rows, size_t column);

// Every rank's `text`, cut to kAgreementTextChars, for error messages. It is a collective:
// call it only where every rank has found the same disagreement in the rows.
constexpr size_t kAgreementTextChars = 511;
std::vector<std::string> gather_texts(const DeviceMesh& mesh, const std::string& text);

// Where `column` differs between rows, every rank raises "<what>: global rank A read <text A>
// and global rank B read <text B>. <advice>", the texts being each rank's `what_i_read()`
// (gathered only then).
void check_rows_agree(const DeviceMesh& mesh, const AgreementRows& rows, size_t column, const std::string& what,
                      const std::function<std::string()>& what_i_read, const std::string& advice);

// A rank that fails to read its arguments must not raise alone (its peers would wait in the
// next collective). It runs the reading through `failure_of`, puts `failure_code` of the result
// in its row, and after the gather every rank calls raise_where_any_rank_failed: a failing rank
// rethrows its own error, the others raise the first failing rank's message, naming it, as the
// same kind of error (ValueError stays ValueError in Python).
template <class Read>
std::exception_ptr failure_of(Read&& read) {
  try {
    read();
    return nullptr;
  } catch (const c10::Error&) {
    return std::current_exception();
  }
}
int64_t failure_code(const std::exception_ptr& failure);  // 0: none
void raise_where_any_rank_failed(const DeviceMesh& mesh, const AgreementRows& rows, size_t failed_column,
                                 const std::exception_ptr& mine);

// Whether the checks run: SHARDTENSOR_CHECK_AGREEMENT=0 turns them off. They cost one small
// all-gather per from_local and distribute_tensor, and one per mesh after each manual_seed.
// Every rank must hold the same setting.
bool agreement_checks_enabled();
void set_agreement_checks_enabled(bool enabled);

// The key of the next random draw on `mesh`. The first draw on a mesh after each manual_seed
// checks that every rank of the mesh was given the same seed, and raises on every rank if not:
// a Replicate tensor would otherwise hold different values on different ranks.
uint64_t next_random_key_on(const DeviceMesh& mesh);
// manual_seed(seed, mesh): the same check, now, then the seed (the mesh counts as checked).
void seed_checked_over(const DeviceMesh& mesh, uint64_t seed);

}  // namespace shardtensor
