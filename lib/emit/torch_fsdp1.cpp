// --emit torch: a Python module whose apply_fsdp(model) wraps the model with
// PyTorch FSDP1 exactly as planned: the unit list is spelled out (a size
// threshold is kept as PyTorch's own size policy), and the function checks
// the units FSDP built against the plan before it returns.
#include <sstream>

#include "emit/emit.h"
#include "emit/emit_text.h"
#include "emit/selective_ac.h"
#include "fsdp1/memory.h"
#include "model/class_names.h"
#include "policy/ignored.h"

namespace fsdp_plan {

namespace {

// The FSDP1 module's parts, worked out once from the plan.
class Fsdp1TorchWriter {
 public:
  explicit Fsdp1TorchWriter(const Plan& plan)
      : plan_(plan), p_(plan.policy), tree_(*plan.tree), s_(plan.memory.settings),
        size_policy_(p_.min_num_params && !p_.module_classes && !p_.force_leaf_given && !p_.exclude_wrap_given),
        // The strategy asked for: FSDP itself falls back to NO_SHARD on one rank.
        hybrid_(s_.strategy == ShardingStrategy::HybridShard) {
    for (size_t i = 1; i < plan.units.size(); ++i) units_.push_back(tree_.path(plan.units[i].module));
    // Ignored state: FSDP1 takes modules or states, not both; parameters by name
    // cover both (an ignored module's parameters are all ignored).
    Ignored ignored = resolve_ignored(tree_, p_);
    ignored_modules_ = top_ignored_modules(tree_, ignored);
    if (!p_.ignored_params.empty()) {
      ignored_params_ = ignored_param_names(tree_, ignored);
      ignored_modules_.clear();
    }
    checkpointed_ = checkpointed_paths(plan);
    selective_ = !checkpointed_.empty() && p_.activation_checkpointing && p_.activation_checkpointing->selective();
  }

  // apply_fsdp's signature and its auto-wrap policy. The function is written
  // first: the imports are those it uses (the code passes a linter, ruff check
  // in tests/accelerate/test_accelerate.py), and device_type is a parameter
  // only where the device mesh of HYBRID_SHARD needs it.
  void write_policy(std::ostringstream& o) const {
    o << "def apply_fsdp(model, " << (hybrid_ ? "device_type=\"cuda\", " : "") << "**fsdp_kwargs):\n";
    if (!checkpointed_.empty())  // by identity: wrapping changes the paths
      o << (selective_ ? "    checkpointed = {id(model.get_submodule(path)): path for path in CHECKPOINTED}\n"
                       : "    checkpointed = {id(model.get_submodule(path)) for path in CHECKPOINTED}\n");
    if (size_policy_) {
      o << "    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=" << *p_.min_num_params << ")\n";
    } else if (p_.auto_wrap()) {
      o << "    units = {id(model.get_submodule(path)) for path in UNITS}\n"
           "    policy = CustomPolicy(lambda module: id(module) in units)\n";
    } else {
      o << "    policy = None  # no auto-wrap: the root is the only unit\n";
    }
  }

  // FSDP1's MixedPrecision: only what differs from its defaults.
  void write_mixed_precision(std::ostringstream& o) const {
    if (!p_.mixed_precision) {
      o << "    mixed_precision = None\n";
      return;
    }
    const auto& mp = *p_.mixed_precision;
    o << "    mixed_precision = MixedPrecision(param_dtype=" << py_dtype(mp.param_dtype)
      << ", reduce_dtype=" << py_dtype(mp.reduce_dtype) << ", buffer_dtype=" << py_dtype(mp.buffer_dtype);
    if (mp.keep_low_grads()) o << ", keep_low_precision_grads=True";
    if (mp.casts_forward_inputs(FsdpVersion::V1)) o << ", cast_forward_inputs=True";
    if (!mp.casts_root_forward_inputs()) o << ", cast_root_forward_inputs=False";
    if (mp.ignore_classes_given) {
      o << ",\n        _module_classes_to_ignore=tuple({type(m) for m in model.modules()\n"
           "            if any(c.__module__ + \".\" + c.__name__ == name or c.__name__ == name\n"
           "                   for c in type(m).__mro__ for name in " << py_list(mp.ignore_classes, "            ") << ")})";
    }
    o << ")\n";
  }

  // HYBRID_SHARD's device mesh, the FSDP call, the check of the units it
  // built, and activation checkpointing after wrapping.
  void write_wrap(std::ostringstream& o) const {
    if (hybrid_) {
      const int64_t r = plan_.mesh.size(MeshDim::DpReplicate), g = plan_.mesh.size(MeshDim::DpShard);
      o << "    from torch.distributed.device_mesh import init_device_mesh\n"
        << "    # HYBRID_SHARD: replicate over " << r << " groups of " << g << " ranks, shard within each.\n"
        << "    fsdp_kwargs.setdefault(\"device_mesh\", init_device_mesh(device_type, (" << r << ", " << g << ")))\n";
    }
    o << "    if IGNORED_PARAMS:\n"
         "        fsdp_kwargs[\"ignored_states\"] = [model.get_parameter(name) for name in IGNORED_PARAMS]\n"
         "    elif IGNORED_MODULES:\n"
         "        fsdp_kwargs[\"ignored_modules\"] = [model.get_submodule(path) for path in IGNORED_MODULES]\n"
         "    wrapped = FSDP(\n"
         "        model,\n"
         "        auto_wrap_policy=policy,\n"
      << "        sharding_strategy=ShardingStrategy." << strategy_name(s_.strategy) << ",\n"
      << "        mixed_precision=mixed_precision,\n"
      << "        use_orig_params=" << (s_.use_orig_params ? "True" : "False") << ",\n"
      << "        **fsdp_kwargs,\n"
         "    )\n"
         "    if sorted(built_units(wrapped)) != sorted(UNITS):\n"
         "        raise RuntimeError(f\"FSDP built the units {built_units(wrapped)}, the plan has {UNITS}\")\n";
    if (s_.fp32_master_weights)  // plan/master_weights.h: what the plan counts
      o << "    # fp32 master weights, as Accelerate upcasts after wrapping (accelerator.py: prepare_model): each\n"
           "    # unit's flat parameter that requires grad, whole (on the meta device too, which Accelerate skips).\n"
           "    for module in FSDP.fsdp_modules(wrapped):\n"
           "        handle = module._handle\n"
           "        if handle is None or not handle.flat_param.requires_grad:\n"
           "            continue\n"
           "        if str(handle.flat_param.dtype) != \"torch.float32\":\n"
           "            handle.flat_param.data = handle.flat_param.data.float()\n"
           "            handle._orig_param_dtype = handle.flat_param.dtype\n";
    if (selective_)
      o << selective_ac_apply("wrapped");
    else if (!checkpointed_.empty())
      // After wrapping, non-reentrant, as Accelerate applies it under FSDP1 (accelerator.py: prepare_model).
      o << "    wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)\n"
           "    apply_activation_checkpointing(\n"
           "        wrapped, checkpoint_wrapper_fn=wrapper, check_fn=lambda module: id(module) in checkpointed\n"
           "    )\n";
    o << "    return wrapped\n";
  }

  // The module's comment, the imports apply_fsdp uses (torch only if
  // `mp_code` names a torch dtype), the plan's lists and built_units.
  std::string header(const std::string& mp_code) const {
    const bool class_policy = p_.auto_wrap() && !size_policy_;
    std::ostringstream head;
    head << "# Generated by fsdp-plan from " << plan_.model.path << ": applies the plan's " << plan_.units.size()
         << " FSDP units\n"
            "# with PyTorch FSDP1 (FullyShardedDataParallel). Call after torch.distributed.init_process_group:\n"
         << (hybrid_ ? "#     model = apply_fsdp(model, device_type=\"cuda\", device_id=torch.cuda.current_device())\n"
                       "# device_type is the device mesh's (HYBRID_SHARD); extra keyword arguments go to\n"
                       "# FullyShardedDataParallel (device_id, ...); apply_fsdp raises if the\n"
                     : "#     model = apply_fsdp(model, device_id=torch.cuda.current_device())\n"
                       "# Extra keyword arguments go to FullyShardedDataParallel; apply_fsdp raises if the\n")
         << "# units FSDP built are not the plan's (a different model, say).\n"
         << (size_policy_ || (!checkpointed_.empty() && !selective_) ? "import functools\n\n" : "")
         << (selective_ || mp_code.find("torch.") != std::string::npos ? "import torch\n" : "");
    if (!checkpointed_.empty())
      head << "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (\n"
           << (selective_ ? "" : "    CheckpointImpl,\n")
           << "    apply_activation_checkpointing,\n"
              "    checkpoint_wrapper,\n"
              ")\n";
    head << "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
         << "from torch.distributed.fsdp import " << (p_.mixed_precision ? "MixedPrecision, " : "") << "ShardingStrategy\n";
    if (size_policy_) head << "from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy\n";
    if (class_policy) head << "from torch.distributed.fsdp.wrap import CustomPolicy\n";
    if (selective_) head << selective_ac_imports();
    head << "\n# Module paths of the units below the root (the root is the outer FSDP unit).\n"
         << "UNITS = " << py_list(units_, "") << "\n"
         << "IGNORED_MODULES = " << py_list(ignored_modules_, "") << "\n"
         << "IGNORED_PARAMS = " << py_list(ignored_params_, "") << "\n";
    if (!checkpointed_.empty())
      head << "# Activation checkpointing (non-reentrant checkpoint_wrapper) on these modules.\n"
           << "CHECKPOINTED = " << py_list(checkpointed_, "") << "\n";
    if (selective_) head << selective_ac_definitions(*p_.activation_checkpointing);
    head << "\n\n"
         << "def built_units(model):\n"
            "    \"\"\"Module paths of the FSDP units below the root of a wrapped model.\"\"\"\n"
            "    return [name.replace(\"_fsdp_wrapped_module.\", \"\") for name, m in model.named_modules()\n"
            "            if isinstance(m, FSDP) and name]\n\n\n";
    return head.str();
  }

 private:
  const Plan& plan_;
  const Policy& p_;
  const ModuleTree& tree_;
  const FsdpSettings& s_;
  const bool size_policy_;  // a size threshold, kept as PyTorch's own size policy
  const bool hybrid_;
  std::vector<std::string> units_, ignored_modules_, ignored_params_, checkpointed_;
  bool selective_ = false;  // checkpointed_ selectively (emit/selective_ac.h)
};

}  // namespace

std::string plan_to_torch(const Plan& plan) {
  if (plan.context_parallel && plan.tensor_parallel)
    throw EmitError("--emit torch writes context parallelism with FSDP2 alone, not beside tensor parallelism: "
                    "apply tensor parallelism on mesh[\"tp\"] as torchtitan's parallelize_llama does, or plan "
                    "without \"tensor_parallel\" to emit the rest");
  if (plan.expert_parallel)
    throw EmitError("--emit torch does not write expert parallelism: apply it as torchtitan's parallelize does "
                    "(docs/expert-parallel.md), or plan without \"expert_parallel\"");
  // torchtitan compiles blocks under FSDP2 only; FSDP1 with torch.compile needs use_orig_params
  // and compiles the wrapped model as a whole.
  if (!plan.activations.compiled.empty() && (plan.tensor_parallel || !plan.v2()))
    throw EmitError("--emit torch writes \"compile\" with 1-D FSDP2 plans (fully_shard after each block's "
                    "compile, torchtitan's order): plan FSDP2 without \"tensor_parallel\", or without \"compile\"");
  if (plan.tensor_parallel) return plan_to_torch_fsdp2_tp(plan);
  if (plan.v2()) return plan_to_torch_fsdp2(plan);
  const Fsdp1TorchWriter w(plan);
  std::ostringstream o;
  w.write_policy(o);
  w.write_mixed_precision(o);
  const std::string mp_code = o.str();  // torch.<dtype> appears only here
  w.write_wrap(o);
  return w.header(mp_code) + o.str();
}

}  // namespace fsdp_plan
