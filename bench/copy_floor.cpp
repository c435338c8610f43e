// See copy_floor.h.
#include "copy_floor.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace copy_floor {

SharedMapping::SharedMapping(const std::string& name, size_t bytes, bool create) : name_(name), bytes_(bytes) {
  const int fd = shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error("copy_floor: shm_open(" + name + "): " + std::strerror(errno));
  if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw std::runtime_error("copy_floor: ftruncate(" + name + "): " + std::strerror(error));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throw std::runtime_error("copy_floor: mmap(" + name + "): " + std::strerror(errno));
  data_ = static_cast<char*>(p);
}

SharedMapping::~SharedMapping() {
  if (data_) munmap(data_, bytes_);
}

void SharedMapping::unlink() const { shm_unlink(name_.c_str()); }

void append_box(std::vector<Stretch>* stretches, const std::vector<int64_t>& shape, const std::vector<int64_t>& from_strides,
                const std::vector<size_t>& from_bases, const std::vector<int64_t>& to_strides, size_t to_base,
                size_t element_bytes) {
  const size_t dims = shape.size();
  for (int64_t extent : shape)
    if (extent == 0) return;
  const size_t run_bytes = static_cast<size_t>(dims ? shape.back() : 1) * element_bytes;
  std::vector<int64_t> index(dims ? dims - 1 : 0, 0);
  while (true) {
    size_t from_offset = 0, to_offset = to_base;
    for (size_t d = 0; d + 1 < dims; ++d) {
      from_offset += static_cast<size_t>(index[d] * from_strides[d]) * element_bytes;
      to_offset += static_cast<size_t>(index[d] * to_strides[d]) * element_bytes;
    }
    Stretch next{to_offset, {}, run_bytes};
    for (size_t base : from_bases) next.from.push_back(base + from_offset);
    Stretch* last = stretches->empty() ? nullptr : &stretches->back();
    bool continues = last && last->to + last->bytes == next.to && last->from.size() == next.from.size();
    for (size_t k = 0; continues && k < next.from.size(); ++k) continues = last->from[k] + last->bytes == next.from[k];
    if (continues) last->bytes += run_bytes;
    else stretches->push_back(std::move(next));
    // The next index over every dim but the last, row-major.
    size_t d = index.size();
    while (d > 0 && ++index[d - 1] == shape[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

namespace {

void sum(float* __restrict out, const std::vector<const float*>& in, size_t n) {
  switch (in.size()) {
    case 2: {
      const float *__restrict a = in[0], *__restrict b = in[1];
      for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      return;
    }
    case 3: {
      const float *__restrict a = in[0], *__restrict b = in[1], *__restrict c = in[2];
      for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i] + c[i];
      return;
    }
    case 4: {
      const float *__restrict a = in[0], *__restrict b = in[1], *__restrict c = in[2], *__restrict d = in[3];
      for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i] + c[i] + d[i];
      return;
    }
    default: throw std::invalid_argument("copy_floor: sums of 2 to 4 sources only");
  }
}

}  // namespace

void run(char* base, const std::vector<Stretch>& stretches) {
  std::vector<const float*> sources;
  for (const Stretch& s : stretches) {
    if (s.from.size() == 1) {
      std::memcpy(base + s.to, base + s.from[0], s.bytes);
      continue;
    }
    sources.clear();
    for (size_t from : s.from) sources.push_back(reinterpret_cast<const float*>(base + from));
    sum(reinterpret_cast<float*>(base + s.to), sources, s.bytes / sizeof(float));
  }
}

}  // namespace copy_floor
