// Class declarations read from the Python source TorchScript stores under
// `code/` in an archive. Only the class headers matter to us: which classes
// are modules, and their attributes in declaration order with the
// parameter/buffer flags. That order is the ClassType slot order torch::jit::load
// builds (SourceImporterImpl::importClass), so walking it reproduces the JIT
// loader's registration order. No torch headers here.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fsdp_plan {

struct AttributeDecl {
  std::string name;
  std::string type;  // the annotation as written: "Tensor", "__torch__.foo.Bar", ...
  bool is_param = false;
  bool is_buffer = false;
};

struct ClassDecl {
  bool is_module = false;      // `class X(Module):`
  bool is_interface = false;   // `class X(ModuleInterface):` or `(Interface)`: a slot's type, never an object's
  bool has_setstate = false;   // defines __setstate__: its pickled state is not a plain dict
  std::vector<AttributeDecl> attributes;  // declaration order
};

// The classes of one `code/...py` file by bare name ("Linear"), in order of
// first declaration; a name declared twice keeps the later body. A vector,
// not a map: a file holds a class or two, and a file with mangled classes
// comes once per module.
using ClassDecls = std::vector<std::pair<std::string, ClassDecl>>;

// Parses one file. Throws std::runtime_error with a one-line message on a
// line the TorchScript printer does not write: a class header other than
// its six forms, a class-level statement that is not an attribute, a
// constant, a flag list or a method, a flag naming no attribute.
// torch.jit.load compiles the file and refuses every such edit; a structure
// reader that skipped them would plan a different tree (issue 29:
// `class Block(Module1:` lost 33 modules).
ClassDecls parse_class_decls(const std::string& source);

// Brackets nest a few levels in printed TorchScript (4 in the corpus); LibTorch's
// parser recurses per level and dies near 10^5.
constexpr size_t kMaxCodeNesting = 100;

// The deepest bracket nesting in a code record (parentheses, brackets,
// braces; quotes not followed), stopping early past kMaxCodeNesting.
size_t code_nesting(const std::string& source);

// The class named `name` in `decls`, or nullptr.
const ClassDecl* find_class(const ClassDecls& decls, const std::string& name);

}  // namespace fsdp_plan
