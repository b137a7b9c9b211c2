#include "util/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
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

// Devices and pipes (/dev/stdout, a FIFO) cannot be replaced by a rename, and
// must not be: write to them in place.
void write_in_place(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open for writing");
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      errno = err;
      fail_errno("write failed");
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) fail_errno("close failed");
}

}  // namespace

void write_stdout(const std::string& data, const std::string& what) {
  // Unbuffered, so the error is this write's errno (ENOSPC, EBADF), not a stream's lost state.
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(STDOUT_FILENO, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw InputError("standard output", "cannot write the " + what + ": write failed: " + std::strerror(errno));
    done += static_cast<size_t>(n);
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
  if (path.empty()) return write_stdout(data, what);
  try {
    write_file_atomic(path, data);
  } catch (const std::runtime_error& e) {
    throw InputError(path, "cannot write the " + what + ": " + e.what());
  }
}

void write_file_atomic(const std::string& named, const std::string& data) {
  std::string path = named;
  struct stat st {};
  if (::stat(named.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw std::runtime_error("it is a directory");
    if (!S_ISREG(st.st_mode)) {
      write_in_place(named, data);
      return;
    }
    // A regular file, perhaps behind links: the rename replaces the file itself, and the links stay.
    if (char* real = ::realpath(named.c_str(), nullptr)) {
      path = real;
      std::free(real);
    }
  } else {
    path = follow_links(named);  // nothing there, or a dangling link: create what it names
  }
  std::string tmp = path + ".tmp-XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw std::runtime_error(std::string("cannot create a file beside it: ") + std::strerror(errno));
  auto fail = [&](const char* what) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw std::runtime_error(std::string(what) + ": " + std::strerror(err));
  };
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed");
    }
    done += static_cast<size_t>(n);
  }
  // mkstemp makes the file 0600; give it the permissions a plain create would.
  mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0) fail("chmod failed");
  if (::fsync(fd) != 0) fail("sync failed");
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(std::string("close failed: ") + std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(std::string("rename failed: ") + std::strerror(err));
  }
}

}  // namespace fsdp_plan
