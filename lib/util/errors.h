// Errors that reach the user. The CLI turns each into one line on stderr and
// a documented exit code; nothing below the CLI prints.
#pragma once

#include <stdexcept>
#include <string>

namespace fsdp_plan {

// Bad input: a model or policy file that cannot be used as given (exit 2).
// `file` is the offending file; the message says what is wrong with it,
// without repeating the file name.
class InputError : public std::runtime_error {
 public:
  InputError(std::string file, const std::string& what)
      : std::runtime_error(what), file_(std::move(file)) {}
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

// Input well-formed but too large to plan at the values given (a graph tensor
// or the graph's tensors together past docs/limits.md's bound at these --dim
// values): exit 2 like any InputError; `suggest --maximize` reads it as a
// value that does not fit.
class TooLargeError : public InputError {
 public:
  using InputError::InputError;
};

}  // namespace fsdp_plan
