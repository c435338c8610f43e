// POSIX file helpers for the checkpoint: whole writes and reads at an offset that retry short
// transfers and raise with the path and errno text, fsync of files and directories, and the
// atomic publication of a directory. Nothing here knows the format.
#pragma once

#include <cstdint>
#include <string>

namespace shardtensor::checkpoint {

// An open file descriptor, closed on destruction.
class File {
 public:
  static File create(const std::string& path);     // O_WRONLY|O_CREAT|O_TRUNC
  static File open_read(const std::string& path);  // raises naming the path when absent
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  void write_at(const void* data, int64_t size, int64_t offset);
  void read_at(void* data, int64_t size, int64_t offset) const;  // raises on a short file
  int64_t size() const;
  void sync();  // fsync
  const std::string& path() const { return path_; }

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

bool path_exists(const std::string& path);
std::string read_small_file(const std::string& path);  // the whole file
void sync_directory(const std::string& path);
void make_fresh_directory(const std::string& path);  // removes whatever is there first
void remove_tree(const std::string& path) noexcept;

// Makes `staged` visible as `target` with one rename, then (with `sync`) fsyncs the parent
// directory. An existing `target` is moved aside first and removed after, so a crash leaves
// either the old checkpoint or the new one under `target` (or, between the two renames, none:
// never a mix).
void publish_directory(const std::string& staged, const std::string& target, bool sync);

}  // namespace shardtensor::checkpoint
