// What a stretch costs in Linux's cross-memory attach, on each side of the copy: the probe
// behind peer memory's choice of who copies a part (src/redistribute/transports/peer_memory/copies.cpp,
// holder_writes). One process copies 1 MiB laid out as 512 stretches of 2 KiB (the columns one
// rank of four sends in S(0)->S(1) of a [2048, 2048] float tensor) through process_vm_readv on
// itself, with the strided side as the "remote" side (whose pages the kernel pins stretch by
// stretch) or as the local side, against the same copy contiguous on both sides and a plain
// memcpy. No torch, no ranks:  build-torch2/bench/cross_memory_stretches
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  constexpr size_t kRows = 512, kRowBytes = 8192, kStretch = 2048, kBytes = kRows * kStretch;
  std::vector<char> strided(kRows * kRowBytes, 1), contiguous(kBytes, 0), other(kBytes, 2);
  std::vector<iovec> stretches(kRows);
  for (size_t r = 0; r < kRows; ++r) stretches[r] = {strided.data() + r * kRowBytes + kStretch, kStretch};
  iovec whole{contiguous.data(), kBytes}, whole_other{other.data(), kBytes};
  const pid_t self = getpid();
  auto time_us = [](auto copy) {
    for (int i = 0; i < 20; ++i) copy();
    constexpr int kRepeats = 400;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kRepeats; ++i) copy();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kRepeats;
  };
  struct Row {
    const char* what;
    double us;
  };
  const Row rows[] = {
      {"remote side strided (512 stretches), local contiguous",
       time_us([&] { process_vm_readv(self, &whole, 1, stretches.data(), kRows, 0); })},
      {"local side strided (512 stretches), remote contiguous",
       time_us([&] { process_vm_readv(self, stretches.data(), kRows, &whole_other, 1, 0); })},
      {"both sides contiguous", time_us([&] { process_vm_readv(self, &whole, 1, &whole_other, 1, 0); })},
      {"memcpy of the 512 stretches", time_us([&] {
         for (size_t r = 0; r < kRows; ++r) std::memcpy(contiguous.data() + r * kStretch, stretches[r].iov_base, kStretch);
       })},
  };
  std::printf("| 1 MiB through process_vm_readv | µs | GB/s |\n|---|---|---|\n");
  for (const Row& r : rows) std::printf("| %s | %.1f | %.2f |\n", r.what, r.us, kBytes / r.us / 1e3);
  const double contiguous_us = rows[2].us;
  std::printf("\nper stretch beyond the contiguous copy: remote %.2f µs, local %.2f µs\n", (rows[0].us - contiguous_us) / kRows,
              (rows[1].us - contiguous_us) / kRows);
  return 0;
}
