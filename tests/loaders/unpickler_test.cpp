// The unpickler on hand-written pickles: what TorchScript writes is read with
// identity kept; anything else is one clear error.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "model/loaders/unpickler.h"

using namespace fsdp_plan::pickle;
using namespace std::string_literals;  // literals with NUL bytes in them

namespace {

std::string s(const std::string& text) {  // BINUNICODE
  std::string out = "X";
  const uint32_t n = static_cast<uint32_t>(text.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + text;
}

// A module with one parameter, tied into a second slot by BINGET.
std::string tied_module(bool requires_grad) {
  std::string p = "\x80\x02" "c__torch__\nM\n)\x81}(";
  p += s("a");
  p += "ctorch._utils\n_rebuild_tensor_v2\n((" + s("storage") + "ctorch\nBFloat16Storage\n" + s("0") +
       s("cpu") + "K\x06tQK\x00K\x02K\x03\x86K\x03K\x01\x86"s + (requires_grad ? "\x88" : "\x89") +
       "ccollections\nOrderedDict\n)RtRq\x00"s;
  p += s("b") + "h\x00"s;
  p += "ub.";
  return p;
}

}  // namespace

TEST_CASE("a module with a tied bfloat16 tensor") {
  const Pickle p = unpickle(tied_module(false));
  REQUIRE(p.node(p.root).kind == Kind::Object);
  CHECK(p.class_name(p.root) == "__torch__.M");
  const auto items = p.elems(p.object(p.root).state);
  REQUIRE(items.size() == 4);
  CHECK(items[1] == items[3]);  // one tensor, two names
  const Tensor& t = p.tensor(items[1]);
  CHECK(std::vector<int64_t>(p.shape(t).begin(), p.shape(t).end()) == std::vector<int64_t>{2, 3});
  CHECK(std::vector<int64_t>(p.stride(t).begin(), p.stride(t).end()) == std::vector<int64_t>{3, 1});
  CHECK(!t.requires_grad);
  CHECK(std::string(p.storage(t.storage).dtype->stem) == "BFloat16");
  CHECK(p.str(p.storage(t.storage).key) == "0");
  CHECK(p.str(p.storage(t.storage).location) == "cpu");
  CHECK(p.storage(t.storage).numel == 6);
  CHECK(unpickle(tied_module(true)).tensors[0].requires_grad);
}

TEST_CASE("typed lists, devices, complex numbers and big integers") {
  std::string p = "\x80\x02(ctorch.jit._pickle\nbuild_intlist\n](K\x01K\x02" "e\x85R";
  p += "ctorch.jit._pickle\nrestore_type_tag\n}" + s("Dict[str, int]") + "\x86R";
  p += "ctorch\ndevice\n" + s("cpu") + "\x85R";
  p += "cbuiltins\ncomplex\nG\x3f\xf0\x00\x00\x00\x00\x00\x00G\x00\x00\x00\x00\x00\x00\x00\x00\x86R"s;
  p += "\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f"s;
  p += "t.";
  const Pickle r = unpickle(p);
  const auto t = r.elems(r.root);
  REQUIRE(t.size() == 5);
  CHECK(r.node(t[0]).kind == Kind::List);
  CHECK(r.elems(t[0]).size() == 2);
  CHECK(r.node(t[1]).kind == Kind::Dict);
  CHECK(r.node(t[2]).kind == Kind::Other);
  CHECK(r.integer(t[4]) == INT64_MAX);
}

TEST_CASE("lists that grow in turns keep their items in order") {
  // Items share one pool: a list grown after another container was made
  // moves to the end of the pool (twice here), one at the end grows in place.
  std::string p = "\x80\x02(]q\x00]q\x01"s;
  p += "h\x00(K\x01K\x02" "e" "h\x01(K\x09" "e" "h\x00(K\x03K\x04K\x05" "e"s;
  p += "h\x01(K\x0aK\x0b" "e" "h\x00(K\x06" "e" "t."s;
  const Pickle r = unpickle(p);
  const auto t = r.elems(r.root);
  REQUIRE(t.size() == 7);
  auto values = [&](NodeId list) {
    std::vector<int64_t> out;
    for (NodeId x : r.elems(list)) out.push_back(r.integer(x));
    return out;
  };
  CHECK(values(t[0]) == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(values(t[1]) == std::vector<int64_t>{9, 10, 11});
  CHECK(t[0] == t[6]);
}

TEST_CASE("refusals name what is wrong") {
  auto error = [](const std::string& p) {
    try {
      unpickle(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error("\x80\x02" "cos\nsystem\n.") == "data.pkl is damaged: unsupported global os.system");
  CHECK(error("\x80\x02" "ctorch._utils\n_rebuild_sparse_tensor\n.") ==
        "data.pkl is damaged: unsupported global torch._utils._rebuild_sparse_tensor");
  CHECK(error("\x80\x02N\x94.").find("unknown opcode 0x94 at byte 3") != std::string::npos);
  CHECK(error("\x80\x03N.") == "data.pkl is damaged: it does not start as a protocol 2 pickle");
  CHECK(error("\x80\x02NN.") == "data.pkl is damaged: it does not end with exactly one value");
  CHECK(error("\x80\x02N") == "data.pkl is damaged: an opcode runs past the end");
  CHECK(error(std::string("\x80\x02X\xf0\xff\xff\xff", 7) + "a.") ==
        "data.pkl is damaged: a string claims 4294967280 bytes, more than data.pkl holds");
  CHECK(error("\x80\x02" "h\x05.") == "data.pkl is damaged: memo index 5 was never set");
  CHECK(error("\x80\x02]q\x00\x85h\x00(N"s "e.") ==
        "data.pkl is damaged: a container is changed after it was used");
  CHECK(error("\x80\x02" + std::string(3000, ']') + std::string(2999, '\x85')).find("nested more than 2000") !=
        std::string::npos);
  CHECK(error("\x80\x02" "c__torch__\nM\n)\x81N\x85R.") == "data.pkl is damaged: REDUCE of something that is not a global");
  CHECK(error("\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\nN\x85R.") ==
        "data.pkl is damaged: torch._utils._rebuild_tensor_v2 gets the wrong arguments");
  CHECK(error("\x80\x02(" + s("storage") + "ctorch\nNoSuchStorage\n") ==
        "data.pkl is damaged: unsupported global torch.NoSuchStorage");
}
