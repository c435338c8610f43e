#include "util/counter_random.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <array>
#include <atomic>
#include <cmath>
#include <mutex>

namespace shardtensor {
namespace {

std::atomic<uint64_t> next_key{0};
std::atomic<uint64_t> last_seed{0};
std::atomic<uint64_t> seed_generation{0};

std::array<uint32_t, 4> philox(uint64_t counter, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53} * c0, p1 = uint64_t{0xCD9E8D57} * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0, n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9;
    k1 += 0xBB67AE85;
  }
  return {c0, c1, c2, c3};
}

double uniform_from(uint32_t hi, uint32_t lo) {  // 53 random bits in [0, 1)
  return static_cast<double>((uint64_t{hi} << 21) ^ (lo >> 11)) * (1.0 / 9007199254740992.0);
}

}  // namespace

at::Tensor counter_draws(const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape,
                         const std::vector<int64_t>& global_shape, uint64_t key, bool normal) {
  at::Tensor values = at::empty(shape, at::kDouble);
  if (values.numel() == 0) return values;
  double* out = values.data_ptr<double>();
  const int64_t ndim = static_cast<int64_t>(global_shape.size());
  std::vector<int64_t> index(ndim, 0);  // row-major walk over the box
  for (int64_t n = 0; n < values.numel(); ++n) {
    int64_t linear = 0;
    for (int64_t d = 0; d < ndim; ++d) linear = linear * global_shape[d] + offsets[d] + index[d];
    const auto bits = philox(static_cast<uint64_t>(linear), key);
    const double u = uniform_from(bits[0], bits[1]);  // Box-Muller below: one normal per element
    *out++ = normal ? std::sqrt(-2.0 * std::log1p(-u)) * std::cos(2.0 * M_PI * uniform_from(bits[2], bits[3])) : u;
    for (int64_t d = ndim - 1; d >= 0 && ++index[d] == shape[d]; --d) index[d] = 0;
  }
  return values;
}

uint64_t next_random_key() {
  if (seed_generation.load() > 0) return next_key++;
  at::Generator torch_default = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(torch_default.mutex());
  return torch_default.get<at::CPUGeneratorImpl>()->random64();
}

uint64_t torch_generator_seed() {
  at::Generator torch_default = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(torch_default.mutex());
  return torch_default.current_seed();
}

void set_random_seed(uint64_t seed) {
  next_key = seed;
  last_seed = seed;
  ++seed_generation;
}

SeedState random_seed_state() { return {last_seed.load(), seed_generation.load()}; }

}  // namespace shardtensor
