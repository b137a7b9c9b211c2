// The module tree JSON loader (lib/model/loaders/tree_loader.cpp) and the
// .pt2 record reader (export_record.cpp) on hand-written inputs: what they
// keep (bases, no_split_modules, ties), and a one-line InputError for every
// way a file can be wrong. Also runs every file of the fuzzer's regression
// inputs (REGRESSIONS, tests/fuzz/regressions/tree): each must load or throw
// InputError.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "model/class_names.h"
#include "model/loaders/export_record.h"
#include "model/loaders/tree_loader.h"
#include "planner/planner.h"
#include "util/errors.h"

using namespace fsdp_plan;

namespace {

// A slot: "name", tensor number, shape, dtype.
std::string slot(const std::string& name, int tensor, const std::string& shape = "[4, 4]",
                 const std::string& dtype = "float32", int itemsize = 4, bool grad = true) {
  return "{\"name\": \"" + name + "\", \"tensor\": " + std::to_string(tensor) + ", \"shape\": " + shape +
         ", \"dtype\": \"" + dtype + "\", \"itemsize\": " + std::to_string(itemsize) +
         ", \"requires_grad\": " + (grad ? "true" : "false") + "}";
}

std::string module(const std::string& path, const std::string& type, const std::string& params = "",
                   const std::string& bases = "[\"torch.nn.modules.module.Module\"]", const std::string& buffers = "") {
  return "{\"path\": \"" + path + "\", \"type\": \"" + type + "\", \"bases\": " + bases + ", \"params\": [" + params +
         "], \"buffers\": [" + buffers + "]}";
}

std::string tree(const std::string& modules, int num_tensors, const std::string& extra = "") {
  return "{\"tree_format\": 1, \"producer\": \"test\"" + extra + ", \"modules\": [" + modules +
         "], \"num_tensors\": " + std::to_string(num_tensors) + "}";
}

// Net(Base) with two Block(MyBase(nn.Module)) layers and a head tied to the embedding.
std::string user_hierarchy() {
  const std::string block_bases = "[\"my.MyBase\", \"torch.nn.modules.module.Module\"]";
  return tree(module("", "my.Net", "", "[\"torch.nn.modules.module.Module\"]") + "," +
                  module("emb", "torch.nn.modules.sparse.Embedding", slot("weight", 0, "[10, 4]"),
                         "[\"torch.nn.modules.module.Module\"]") + "," +
                  module("blocks", "torch.nn.modules.container.ModuleList") + "," +
                  module("blocks.0", "my.Block", slot("w", 1), block_bases) + "," +
                  module("blocks.1", "my.Block", slot("w", 2), block_bases,
                         "{\"name\": \"mask\", \"tensor\": 3, \"shape\": [4], \"dtype\": \"bool\", \"itemsize\": 1, "
                         "\"requires_grad\": false, \"persistent\": false}") + "," +
                  module("head", "torch.nn.modules.linear.Linear", slot("weight", 0, "[10, 4]"),
                         "[\"torch.nn.modules.module.Module\"]"),
              4, ", \"no_split_modules\": [\"Block\"]");
}

std::string error_of(const std::string& text) {
  try {
    parse_tree_json(text, "m.tree.json");
  } catch (const InputError& e) {
    CHECK(e.file() == "m.tree.json");
    const std::string msg = e.what();
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  }
  return "";
}

}  // namespace

TEST_CASE("a module tree JSON loads with its ties, bases and record") {
  ModuleTree t = parse_tree_json(user_hierarchy(), "m.tree.json");
  REQUIRE(t.num_modules() == 6);
  CHECK(t.num_tensors() == 4);
  CHECK(t.path(4) == "blocks.1");
  CHECK(t.module(1).params[0].tensor == t.module(5).params[0].tensor);  // the tie
  CHECK(t.module(4).buffers.size() == 1);
  CHECK(t.tensor(3).dtype == "bool");
  REQUIRE(t.recorded_bases("my.Block") != nullptr);
  CHECK((*t.recorded_bases("my.Block"))[0] == "my.MyBase");
  REQUIRE(t.record() != nullptr);
  REQUIRE(t.record()->no_split_modules);
  CHECK(*t.record()->no_split_modules == std::vector<std::string>{"Block"});
  CHECK(t.record()->root_class == "my.Net");
}

TEST_CASE("a policy naming a user's base class matches its subclasses, as isinstance does") {
  ModuleTree t = parse_tree_json(user_hierarchy(), "m.tree.json");
  ClassMatcher matcher(t);
  CHECK(matcher.is_instance("my.Block", {"MyBase"}));
  CHECK(matcher.is_instance("my.Block", {"my.MyBase"}));
  CHECK_FALSE(matcher.is_instance("my.Net", {"MyBase"}));
  Policy p;
  p.module_classes = std::vector<std::string>{"MyBase"};
  Plan plan = make_plan(t, p, "m.tree.json");
  std::vector<std::string> units;
  for (const auto& u : plan.units) units.push_back(t.path(u.module));
  CHECK(units == std::vector<std::string>{"", "blocks.0", "blocks.1"});
}

TEST_CASE("a tree without a record of _no_split_modules has none") {
  ModuleTree t = parse_tree_json(tree(module("", "my.Net"), 0), "m.tree.json");
  REQUIRE(t.record() != nullptr);
  CHECK_FALSE(t.record()->no_split_modules);
}

TEST_CASE("every way a module tree JSON is wrong is one line") {
  const std::string root = module("", "my.Net");
  CHECK(error_of("{\"tree_format\": 1, \"modules\": [").find("invalid JSON") != std::string::npos);
  CHECK(error_of("{\"module_classes\": [\"Block\"]}").find("this is a policy JSON, not a model") == 0);
  CHECK(error_of("{\"modules\": [], \"num_tensors\": 0}").find("without \"tree_format\"") != std::string::npos);
  CHECK(error_of("{\"a\": 1}").find("a JSON file, not a model") == 0);
  CHECK(error_of("{\"tree_format\": 2, \"modules\": []}").find("tree_format 2, but this fsdp-plan reads tree_format 1") !=
        std::string::npos);
  CHECK(error_of("{\"tree_format\": 1, \"modules\": [], \"num_tensors\": 0}").find("no \"modules\" list") !=
        std::string::npos);
  CHECK(error_of(tree(module("x", "A"), 0)).find("the first module must be the root") != std::string::npos);
  CHECK(error_of(tree(root + "," + module("a.b", "A"), 0)).find("its parent \"a\" is not listed before it") !=
        std::string::npos);
  CHECK(error_of(tree(root + "," + module("a", "A") + "," + module("a", "A"), 0)).find("listed twice") !=
        std::string::npos);
  CHECK(error_of(tree(root + "," + module("a..b", "A"), 0)).find("not listed before it") != std::string::npos);
  CHECK(error_of(tree(module("", "N", slot("w", 1)), 1)).find("\"tensor\" is not a number below num_tensors (1)") !=
        std::string::npos);
  CHECK(error_of(tree(module("", "N", slot("w", 0, "[-1]")), 1)).find("an impossible shape") != std::string::npos);
  CHECK(error_of(tree(module("", "N", slot("w", 0, "[4611686018427387904, 64]")), 1)).find("an impossible shape") !=
        std::string::npos);
  CHECK(error_of(tree(module("", "N", slot("w", 0, "[4]", "float33")), 1)).find("unknown dtype \"float33\"") !=
        std::string::npos);
  CHECK(error_of(tree(module("", "N", slot("w", 0, "[4]", "bfloat16", 4)), 1))
            .find("\"itemsize\" is not 2, the itemsize of bfloat16") != std::string::npos);
  CHECK(error_of(tree(module("", "N", slot("w", 0) + "," + slot("v", 0, "[4]")), 1))
            .find("tensor 0 was listed before with another shape") != std::string::npos);
  CHECK(error_of(tree(module("", "N", slot("w", 0) + "," + slot("v", 0)), 2)).find("no slot holds tensor 1") !=
        std::string::npos);
  // More tensors than slots (issue 39: 15 million claimed in 15 MB allocated 1.08 GB up front).
  CHECK(error_of(tree(module("", "N", slot("w", 0)), 2))
            .find("num_tensors is 2, but the modules hold 1 parameter and buffer slots") != std::string::npos);
  CHECK(error_of(tree(module("", "N", slot("a.b", 0)), 1)).find("has a dot") != std::string::npos);
  CHECK(error_of(tree(module("", "N", "", "\"x\""), 0)).find("\"bases\" is not a list") != std::string::npos);
  CHECK(error_of(tree(root, 0, ", \"no_split_modules\": [3]")).find("\"no_split_modules\" is not a list") !=
        std::string::npos);
  CHECK(error_of(tree(root, -1)).find("no \"num_tensors\"") != std::string::npos);
  // The place in the file is named.
  CHECK(error_of(tree(root + "," + module("a", "A", slot("w", 0, "[-1]")), 1)) ==
        "module tree JSON is damaged (modules[1] \"a\": params[0] \"w\": an impossible shape); write it again with "
        "fsdp_plan.tree.module_tree(module)");
}

TEST_CASE("deep nesting in a module tree JSON is an error, not a crash") {
  std::string deep = "{\"tree_format\": 1, \"x\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  // The JSON reader's own bound (util/json_input.h, docs/limits.md) stops it first.
  CHECK(error_of(deep).find("nested more than 100 deep") != std::string::npos);
}

TEST_CASE("the fuzzer's regression inputs load or give InputError") {
  const char* dir = std::getenv("REGRESSIONS");
  if (!dir) return;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      ModuleTree t = parse_tree_json(ss.str(), e.path().string());
      Policy p;
      p.module_classes = std::vector<std::string>{"Block"};
      (void)make_plan(t, p, "r");
    } catch (const InputError& err) {
      CHECK(std::string(err.what()).find('\n') == std::string::npos);
    }
    ++n;
  }
  CHECK(n > 0);
}

TEST_CASE("the .pt2 record: what it keeps, and its errors") {
  const std::string ok =
      "{\"format\": \"fsdp-plan-export\", \"format_version\": 1, \"no_split_modules\": [\"LlamaDecoderLayer\"], "
      "\"dtype\": \"bfloat16\", \"root_class\": \"t.LlamaForCausalLM\", \"hf_attention\": \"eager\", "
      "\"exporter\": {\"fsdp_plan\": \"0.1.0\", \"torch\": \"2.13.0\"}, "
      "\"base_model_tp_plan\": {\"layers.*.mlp.down_proj\": \"rowwise\"}, \"unknown_key\": [1, 2]}";
  ModelRecord r = parse_export_record(ok, "m.pt2");
  REQUIRE(r.no_split_modules);
  CHECK(*r.no_split_modules == std::vector<std::string>{"LlamaDecoderLayer"});
  CHECK(r.dtype == "bfloat16");
  CHECK(r.hf_attention_trace == "eager");
  CHECK(r.producer == "fsdp_plan 0.1.0, torch 2.13.0");
  REQUIRE(r.tp_plan.size() == 1);
  CHECK(r.tp_plan[0].second == "rowwise");
  CHECK_FALSE(parse_export_record("{\"format\": \"fsdp-plan-export\", \"format_version\": 1, \"no_split_modules\": null}",
                                  "m.pt2").no_split_modules);
  auto err = [](const std::string& text) {
    try {
      parse_export_record(text, "m.pt2");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(err("{") == "record extra/fsdp_plan.json is damaged (invalid JSON); export the model again with fsdp-plan-export");
  CHECK(err("{\"format\": \"other\"}").find("its \"format\" is not \"fsdp-plan-export\"") != std::string::npos);
  CHECK(err("{\"format\": \"fsdp-plan-export\", \"format_version\": 2, \"no_split_modules\": null}") ==
        "record extra/fsdp_plan.json has format_version 2, but this fsdp-plan reads version 1: use the fsdp-plan "
        "of the fsdp-plan-export that wrote it");
  CHECK(err("{\"format\": \"fsdp-plan-export\", \"format_version\": 1}").find("no \"no_split_modules\"") !=
        std::string::npos);
  CHECK(err("{\"format\": \"fsdp-plan-export\", \"format_version\": 1, \"no_split_modules\": \"Block\"}")
            .find("not a list of class names") != std::string::npos);
  CHECK(err("{\"format\": \"fsdp-plan-export\", \"format_version\": 1, \"no_split_modules\": [], \"dtype\": 3}")
            .find("\"dtype\" is not a string") != std::string::npos);
  for (const char* classes : {"[]", "{\"a\": 1}", "{\"a\": \"\"}"})
    CHECK(err(std::string("{\"format\": \"fsdp-plan-export\", \"format_version\": 1, \"no_split_modules\": [], "
                          "\"module_classes\": ") + classes + "}")
              .find("\"module_classes\" is not an object of class names") != std::string::npos);
}

TEST_CASE("export record: module_classes name only the modules the graph did not") {
  ModuleTree t;
  const ModuleId layers = t.add_module(0, "layers", kUnrecordedClass);
  const ModuleId l0 = t.add_module(layers, "0", "m.Block");
  const ModuleId head = t.add_module(0, "head", "torch.nn.modules.container.ModuleList");
  t.module(0).type_name = "m.Net";
  t.module(layers).class_source = ClassSource::Unrecorded;
  t.module(head).class_source = ClassSource::Inferred;
  t.set_record(parse_export_record(
      "{\"format\": \"fsdp-plan-export\", \"format_version\": 1, \"no_split_modules\": null, \"module_classes\": "
      "{\"\": \"m.Other\", \"layers\": \"torch.nn.modules.container.Sequential\", \"layers.0\": \"m.Other\", "
      "\"head\": \"torch.nn.modules.container.ModuleDict\", \"gone\": \"m.X\"}}",
      "m.pt2"));
  adopt_listed_classes(t);
  CHECK(t.module(0).type_name == "m.Net");  // the graph's classes stay
  CHECK(t.module(0).class_source == ClassSource::Recorded);
  CHECK(t.module(l0).type_name == "m.Block");
  CHECK(t.module(layers).type_name == "torch.nn.modules.container.Sequential");
  CHECK(t.module(layers).class_source == ClassSource::Listed);
  CHECK(t.module(head).type_name == "torch.nn.modules.container.ModuleDict");  // over the inference
  CHECK(t.module(head).class_source == ClassSource::Listed);
  CHECK(t.num_modules() == 4);  // a path not in the tree adds nothing
}

TEST_CASE("module tree: paths() is path() of every module, empty names included") {
  ModuleTree t;
  const ModuleId a = t.add_module(0, "a", "m.A");
  const ModuleId e = t.add_module(a, "", "m.E");
  t.add_module(e, "x", "m.X");
  t.add_module(0, "", "m.R");
  t.add_module(a, "0", "m.B");
  const std::vector<std::string> all = t.paths();
  REQUIRE(all.size() == t.num_modules());
  for (ModuleId m = 0; m < static_cast<ModuleId>(t.num_modules()); ++m) CHECK(all[static_cast<size_t>(m)] == t.path(m));
}
