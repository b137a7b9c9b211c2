#include "util/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "util/errors.h"

namespace fsdp_plan {

void check_readable_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw InputError(path, errno == ENOENT ? "no such file" : std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) throw InputError(path, "is a directory, not a file");
  if (!S_ISREG(st.st_mode)) throw InputError(path, "is not a regular file");
  if (::access(path.c_str(), R_OK) != 0) throw InputError(path, std::strerror(errno));
}

std::string read_text_file(const std::string& path, uint64_t max_bytes, const std::string& what) {
  // A pipe is fine (--policy <(...), /dev/stdin from a pipe): it is read up to
  // the limit. A device is not: /dev/zero and /dev/urandom never end.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError(path, errno == ENOENT ? "no such file" : std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw InputError(path, "is a directory, not a file");
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) throw InputError(path, "is a device, not a file");
  if (S_ISSOCK(st.st_mode)) throw InputError(path, "is a socket, not a file");
  auto too_big = [&](uint64_t size) {
    return InputError(path, (size > max_bytes ? "is " + std::to_string(size) + " bytes," : std::string("holds")) +
                                " more than " + what + " can be (" + std::to_string(max_bytes >> 20) + " MiB)");
  };
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes)
    throw too_big(static_cast<uint64_t>(st.st_size));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path, "cannot be opened for reading: " + std::string(std::strerror(errno)));
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw InputError(path, "read failed: " + std::string(std::strerror(err)));
    }
    if (n == 0) break;
    // A regular file that grew since the stat, or a pipe: stop one past the limit.
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      ::close(fd);
      throw too_big(0);
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

namespace {

[[noreturn]] void fail_errno(const char* what) {
  throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

// The file `path` names once its symbolic links are followed, the last one
// included even if it dangles: renaming over a link would replace the link
// (what `cp` and shell redirection never do), so the rename goes to its target.
std::string follow_links(std::string path) {
  for (int hops = 0; hops < 40; ++hops) {  // Linux's MAXSYMLINKS
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
    std::string target(4096, '\0');
    const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
    if (n < 0) fail_errno("cannot read the link");
    target.resize(static_cast<size_t>(n));
    path = target[0] == '/' ? target : path.substr(0, path.rfind('/') + 1) + target;
  }
  errno = ELOOP;
  fail_errno("cannot follow the link");
}

// Pieces are gathered to this size before a write(2); one of at least
// kDirectWrite with nothing gathered before it goes as it is, uncopied (the
// JSON writer's pieces of about 64 KB, a whole text plan).
constexpr size_t kWriteChunk = size_t{1} << 20;
constexpr size_t kDirectWrite = size_t{1} << 15;

}  // namespace

OutputWriter::OutputWriter(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
  if (path_.empty()) {
    fd_ = STDOUT_FILENO;
    return;
  }
  guarded([&] {
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) throw std::runtime_error("it is a directory");
      if (!S_ISREG(st.st_mode)) {
        // Devices and pipes (/dev/stdout, a FIFO) cannot be replaced by a rename, and
        // must not be: write to them in place.
        fd_ = ::open(path_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
        if (fd_ < 0) fail_errno("cannot open for writing");
        return;
      }
      // A regular file, perhaps behind links: the rename replaces the file itself, and the links stay.
      target_ = path_;
      if (char* real = ::realpath(path_.c_str(), nullptr)) {
        target_ = real;
        std::free(real);
      }
    } else {
      target_ = follow_links(path_);  // nothing there, or a dangling link: create what it names
    }
    tmp_ = target_ + ".tmp-XXXXXX";
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) {
      tmp_.clear();
      fail_errno("cannot create a file beside it");
    }
  });
}

OutputWriter::~OutputWriter() {
  if (fd_ >= 0 && fd_ != STDOUT_FILENO) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputWriter::write(std::string_view data) {
  if (buffer_.empty() && data.size() >= kDirectWrite) return write_all(data);
  buffer_.append(data);
  if (buffer_.size() >= kWriteChunk) flush();
}

void OutputWriter::flush() {
  write_all(buffer_);
  buffer_.clear();
}

void OutputWriter::write_all(std::string_view data) {
  guarded([&] {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail_errno("write failed");
      done += static_cast<size_t>(n);
    }
  });
}

void OutputWriter::commit() {
  flush();
  if (path_.empty()) return;
  guarded([&] {
    const int fd = fd_;
    fd_ = -1;
    if (!tmp_.empty()) {
      // mkstemp makes the file 0600; give it the permissions a plain create would.
      const mode_t mask = ::umask(0);
      ::umask(mask);
      const char* failed = ::fchmod(fd, 0666 & ~mask) != 0 ? "chmod failed" : ::fsync(fd) != 0 ? "sync failed" : nullptr;
      if (failed) {
        const int err = errno;
        ::close(fd);
        errno = err;
        fail_errno(failed);
      }
    }
    if (::close(fd) != 0) fail_errno("close failed");
    if (!tmp_.empty()) {
      if (::rename(tmp_.c_str(), target_.c_str()) != 0) fail_errno("rename failed");
      tmp_.clear();
    }
  });
}

void OutputWriter::guarded(const std::function<void()>& step) const {
  try {
    step();
  } catch (const std::runtime_error& e) {
    // write(2) itself, not a stdio stream: the error is this write's errno (ENOSPC, EBADF), not a lost state.
    throw InputError(path_.empty() ? "standard output" : path_, "cannot write the " + what_ + ": " + e.what());
  }
}

void refuse_output_over_input(const std::string& output, const std::vector<NamedInput>& inputs) {
  struct stat out {};
  if (output.empty() || ::stat(output.c_str(), &out) != 0 || !S_ISREG(out.st_mode)) return;
  for (const auto& in : inputs) {
    struct stat st {};
    if (in.path.empty() || ::stat(in.path.c_str(), &st) != 0) continue;
    // The same file by device and inode: a second name, a link or ./ does not hide it.
    if (st.st_dev == out.st_dev && st.st_ino == out.st_ino)
      throw InputError(output, "is the " + in.role + (in.path == output ? "" : " (" + in.path + ")") +
                                   ": -o would overwrite it; write to another file");
  }
}

void write_output(const std::string& path, const std::string& data, const std::string& what) {
  OutputWriter out(path, what);
  out.write(data);
  out.commit();
}

}  // namespace fsdp_plan
