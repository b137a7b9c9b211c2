#include <doctest/doctest.h>

#include "model/class_names.h"

using namespace fsdp_plan;

TEST_CASE("demangle strips the __torch__ prefix and mangle segments") {
  CHECK(demangle("__torch__.torch.nn.modules.linear.___torch_mangle_27.Linear") == "torch.nn.modules.linear.Linear");
  CHECK(demangle("__torch__.torch.nn.modules.linear.Linear") == "torch.nn.modules.linear.Linear");
  CHECK(demangle("__torch__.___torch_mangle_3.Model") == "Model");
  CHECK(demangle("__torch__.Model") == "Model");
  CHECK(demangle("mypkg.Block") == "mypkg.Block");
  CHECK(short_name("torch.nn.modules.linear.Linear") == "Linear");
  CHECK(short_name("Block") == "Block");
}

TEST_CASE("short and dotted names match as Python's re-exports allow") {
  CHECK(name_matches("Linear", "torch.nn.modules.linear.Linear"));
  CHECK(name_matches("torch.nn.Linear", "torch.nn.modules.linear.Linear"));
  CHECK(name_matches("torch.nn.modules.linear.Linear", "torch.nn.modules.linear.Linear"));
  CHECK(name_matches("torchvision.models.BasicBlock", "torchvision.models.resnet.BasicBlock"));
  CHECK_FALSE(name_matches("torch.nn.Linear", "mymodels.Linear"));
  CHECK_FALSE(name_matches("torch.nn.Lin", "torch.nn.modules.linear.Linear"));
  CHECK_FALSE(name_matches("torch.n.Linear", "torch.nn.modules.linear.Linear"));  // prefix ends at a dot
  CHECK_FALSE(name_matches("Linear", "torch.nn.modules.linear.LazyLinear"));
}

TEST_CASE("isinstance sees the torch.nn class hierarchy") {
  ClassMatcher m;
  CHECK(m.is_instance("torch.nn.modules.batchnorm.BatchNorm2d", {"_BatchNorm"}));
  CHECK(m.is_instance("torch.nn.modules.batchnorm.SyncBatchNorm", {"torch.nn.modules.batchnorm._BatchNorm"}));
  CHECK(m.is_instance("torch.nn.modules.batchnorm.LazyBatchNorm1d", {"_BatchNorm"}));
  CHECK(m.is_instance("torch.nn.modules.linear.NonDynamicallyQuantizableLinear", {"Linear"}));
  CHECK(m.is_instance("torch.nn.modules.linear.NonDynamicallyQuantizableLinear", {"torch.nn.Linear"}));
  CHECK(m.is_instance("torch.nn.modules.conv.Conv2d", {"_ConvNd"}));
  CHECK(m.is_instance("torch.nn.modules.conv.ConvTranspose1d", {"_ConvNd"}));
  CHECK(m.is_instance("torchvision.ops.misc.Conv2dNormActivation", {"Sequential"}));
  CHECK(m.is_instance("torchvision.models.convnext.LayerNorm2d", {"torch.nn.LayerNorm"}));
  CHECK_FALSE(m.is_instance("torch.nn.modules.normalization.LayerNorm", {"_BatchNorm"}));
  CHECK_FALSE(m.is_instance("torch.nn.modules.linear.Linear", {"NonDynamicallyQuantizableLinear"}));
  CHECK_FALSE(m.is_instance("torch.nn.modules.linear.Linear", {}));
}

TEST_CASE("every module is an nn.Module; a user class knows no other base") {
  ClassMatcher m;
  CHECK(m.is_instance("MyBlock", {"Module"}));
  CHECK(m.is_instance("torch.nn.modules.linear.Linear", {"torch.nn.Module"}));
  CHECK(m.is_instance("MyBlock", {"MyBlock"}));
  CHECK_FALSE(m.is_instance("MyBlock", {"Sequential"}));
  auto lineage = class_lineage("torch.nn.modules.batchnorm.BatchNorm2d");
  REQUIRE(lineage.size() == 4);
  CHECK(lineage[0] == "torch.nn.modules.batchnorm.BatchNorm2d");
  CHECK(lineage[1] == "torch.nn.modules.batchnorm._BatchNorm");
  CHECK(lineage[3] == "torch.nn.modules.module.Module");
}

TEST_CASE("containers without forward: module containers by name and as isinstance patterns, parameter ones on request") {
  CHECK(is_container("torch.nn.modules.container.ModuleList", false));
  CHECK(is_container("torch.nn.modules.container.ModuleDict", false));
  CHECK_FALSE(is_container("torch.nn.modules.container.ParameterList", false));
  CHECK(is_container("torch.nn.modules.container.ParameterList", true));
  CHECK(is_container("ParameterDict", true));
  CHECK_FALSE(is_container("torch.nn.modules.container.Sequential", true));  // it has a forward
  CHECK_FALSE(is_container("my.Block", true));
  const ClassMatcher matcher;
  CHECK(matcher.is_instance("torch.nn.modules.container.ModuleList", module_container_classes()));
  CHECK_FALSE(matcher.is_instance("torch.nn.modules.container.Sequential", module_container_classes()));
}
