// See file_io.h.
#include "checkpoint/file_io.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace shardtensor::checkpoint {
namespace fs = std::filesystem;

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

File File::create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "checkpoint::save: cannot create ", path, ": ", errno_text(), ".");
  return File(fd, path);
}

File File::open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "checkpoint::load: ", path, " is missing or unreadable (", errno_text(), ").");
  return File(fd, path);
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }
File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}
File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_at(const void* data, int64_t size, int64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd_, p, static_cast<size_t>(std::min<int64_t>(size, int64_t(1) << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n > 0, "checkpoint::save: writing ", path_, " failed at byte ", offset, ": ", errno_text(), ".");
    p += n;
    size -= n;
    offset += n;
  }
}

void File::read_at(void* data, int64_t size, int64_t offset) const {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::pread(fd_, p, static_cast<size_t>(std::min<int64_t>(size, int64_t(1) << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n >= 0, "checkpoint::load: reading ", path_, " failed at byte ", offset, ": ", errno_text(), ".");
    TORCH_CHECK(n > 0, "checkpoint::load: ", path_, " ends at byte ", offset, " but ", size,
                " more bytes were expected there: the file is truncated.");
    p += n;
    size -= n;
    offset += n;
  }
}

int64_t File::size() const {
  struct stat st;
  TORCH_CHECK(::fstat(fd_, &st) == 0, "checkpoint: fstat of ", path_, " failed: ", errno_text(), ".");
  return static_cast<int64_t>(st.st_size);
}

void File::sync() {
  TORCH_CHECK(::fsync(fd_) == 0, "checkpoint::save: fsync of ", path_, " failed: ", errno_text(), ".");
}

bool path_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

std::string read_small_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "checkpoint::load: cannot read ", path, ".");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "checkpoint::save: cannot open directory ", path, ": ", errno_text(), ".");
  const int rc = ::fsync(fd);
  const std::string why = rc == 0 ? "" : errno_text();
  ::close(fd);
  TORCH_CHECK(rc == 0, "checkpoint::save: fsync of directory ", path, " failed: ", why, ".");
}

void make_fresh_directory(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  fs::create_directories(path, ec);
  TORCH_CHECK(!ec, "checkpoint::save: cannot create directory ", path, ": ", ec.message(), ".");
}

void remove_tree(const std::string& path) noexcept {
  std::error_code ec;
  fs::remove_all(path, ec);
}

void publish_directory(const std::string& staged, const std::string& target, bool sync) {
  const fs::path target_path = fs::absolute(target).lexically_normal();
  const std::string parent = target_path.parent_path().string();
  std::string aside;
  if (path_exists(target)) {
    aside = target + ".old-" + std::to_string(::getpid());
    remove_tree(aside);
    TORCH_CHECK(::rename(target.c_str(), aside.c_str()) == 0, "checkpoint::save: cannot move the existing ", target,
                " aside to ", aside, ": ", errno_text(), ".");
  }
  if (::rename(staged.c_str(), target.c_str()) != 0) {
    const std::string why = errno_text();
    if (!aside.empty()) ::rename(aside.c_str(), target.c_str());  // put the old checkpoint back
    TORCH_CHECK(false, "checkpoint::save: cannot rename ", staged, " to ", target, ": ", why, ".");
  }
  if (sync) sync_directory(parent);
  if (!aside.empty()) remove_tree(aside);
}

}  // namespace shardtensor::checkpoint
