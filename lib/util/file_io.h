// Reading inputs and writing outputs without leaving half-written files.
#pragma once

#include <string>

namespace fsdp_plan {

// The whole file, or InputError naming it (missing, a directory, unreadable).
std::string read_text_file(const std::string& path);

// Checks that `path` names a readable regular file; InputError otherwise.
void check_readable_file(const std::string& path);

// Writes `data` to a temporary file beside `path`, flushes it, and renames it
// over `path`: readers see the old file or the new one, never a partial one.
// Throws std::runtime_error (with the reason) if any step fails.
void write_file_atomic(const std::string& path, const std::string& data);

// Writes `data` to standard output. A full disk or a closed stdout is an
// output error: InputError naming "standard output", as -o FILE would be.
// `what` names the output in the message ("cannot write the plan").
void write_stdout(const std::string& data, const std::string& what = "plan");

// Writes `data` to `path` atomically, or to standard output when `path` is
// empty; any failure is InputError naming the file: "cannot write the WHAT: ...".
void write_output(const std::string& path, const std::string& data, const std::string& what);

}  // namespace fsdp_plan
