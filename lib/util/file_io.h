// Reading inputs and writing outputs without leaving half-written files.
#pragma once

#include <cstdint>
#include <string>
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

// Writes `data` to a temporary file beside `path`, flushes it, and renames it
// over `path`: readers see the old file or the new one, never a partial one.
// A symbolic link is followed: its target is written, the link stays.
// Throws std::runtime_error (with the reason) if any step fails.
void write_file_atomic(const std::string& path, const std::string& data);

// Writes `data` to standard output. A full disk or a closed stdout is an
// output error: InputError naming "standard output", as -o FILE would be.
// `what` names the output in the message ("cannot write the plan").
void write_stdout(const std::string& data, const std::string& what = "plan");

// An input file and what it is to the command ("model file", "policy file").
struct NamedInput {
  std::string path, role;
};

// InputError naming `output` when it is one of `inputs` (the same device and
// inode, however it is spelt): -o must never overwrite what it reads.
void refuse_output_over_input(const std::string& output, const std::vector<NamedInput>& inputs);

// Writes `data` to `path` atomically, or to standard output when `path` is
// empty; any failure is InputError naming the file: "cannot write the WHAT: ...".
void write_output(const std::string& path, const std::string& data, const std::string& what);

}  // namespace fsdp_plan
