// Reading inputs and writing outputs without leaving half-written files.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp_plan {

// The most bytes each text reader takes (docs/limits.md); an honest file is
// far smaller: a policy is a few KB (suggest -o writes ~2 MB for 37,000
// FSDP2 groups), an Accelerate config 1 KB, a plan of 50,000 units 70 MB.
constexpr uint64_t kMaxPolicyFileBytes = uint64_t{16} << 20;
constexpr uint64_t kMaxPlanFileBytes = uint64_t{128} << 20;

// The whole file, or InputError naming it: missing, a directory, a device or
// socket (a pipe is read: --policy <(...)), unreadable, or more than
// `max_bytes` (`what` names the kind of file in that message: "a policy").
std::string read_text_file(const std::string& path, uint64_t max_bytes, const std::string& what);

// Checks that `path` names a readable regular file; InputError otherwise.
void check_readable_file(const std::string& path);

// An input file and what it is to the command ("model file", "policy file").
struct NamedInput {
  std::string path, role;
};

// InputError naming `output` when it is one of `inputs` (the same device and
// inode, however it is spelt): -o must never overwrite what it reads.
void refuse_output_over_input(const std::string& output, const std::vector<NamedInput>& inputs);

// An output written in pieces, so that a large one (a plan of 100,000 units is
// 265 MB of JSON) is never whole in memory: to standard output as it comes
// when `path` is empty; otherwise to a temporary file beside `path` that
// commit() flushes and renames over it, so readers see the old file or the
// new one, never a partial one (a symbolic link is followed: its target is
// written, the link stays; a device or pipe is written in place). Any failure
// is InputError naming the file (or "standard output"): "cannot write the
// WHAT: REASON". Destroyed uncommitted, it removes its temporary file.
class OutputWriter {
 public:
  OutputWriter(std::string path, std::string what);
  ~OutputWriter();
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;

  void write(std::string_view data);  // buffered
  void commit();

 private:
  void flush();
  void write_all(std::string_view data);  // write(2) until all of it is written
  void guarded(const std::function<void()>& step) const;  // runtime_error -> InputError

  std::string path_, what_;
  std::string target_, tmp_;  // a regular file: the file renamed over, and the temporary one
  int fd_ = -1;
  std::string buffer_;
};

// Writes `data` to `path` atomically, or to standard output when `path` is
// empty, with OutputWriter.
void write_output(const std::string& path, const std::string& data, const std::string& what);

}  // namespace fsdp_plan
