#include "emit/selective_ac.h"

#include <vector>

#include "activations/selective.h"
#include "emit/emit_text.h"

namespace fsdp_plan {

std::string selective_ac_imports() {
  return "from torch.utils.checkpoint import (\n"
         "    CheckpointPolicy,\n"
         "    create_selective_checkpoint_contexts,\n"
         ")\n";
}

std::string selective_ac_definitions(const ActivationCheckpointing& ac) {
  std::vector<std::string> save;
  if (ac.torchtitan_policy)
    for (std::string_view op : torchtitan_save_ops()) save.emplace_back(op);
  else
    save = ac.save_ops;
  std::string o;
  if (ac.torchtitan_policy)
    o += "# Selective activation checkpointing, torchtitan 0.3.0's policy (SelectiveAC._wrap_block): the\n"
         "# outputs of these ops are saved, except every second matmul of a call and every matmul of a\n"
         "# RECOMPUTE_MM_FQNS Linear's weight (force_recompute_mm_shapes_by_fqns); the rest is recomputed.\n"
         "# An op this torch lacks (an optional backend's) is left out, as torchtitan does.\n"
         "TORCHTITAN_POLICY = True\n";
  else
    o += "# Selective activation checkpointing: the outputs of these ops are saved, the rest is recomputed\n"
         "# (the list given to create_selective_checkpoint_contexts).\n"
         "TORCHTITAN_POLICY = False\n";
  o += "SAVE_OPS = " + py_list(save, "") + "\n";
  o += "RECOMPUTE_MM_FQNS = " + py_list(ac.recompute_mm_fqns, "") + "\n";
  o += "\n\n"
       "def _op(name):\n"
       "    \"\"\"torch.ops.<name>, or None where this torch has no such op.\"\"\"\n"
       "    obj = torch.ops\n"
       "    for part in name.split(\".\"):\n"
       "        obj = getattr(obj, part, None)\n"
       "        if obj is None:\n"
       "            return None\n"
       "    return obj\n"
       "\n\n"
       "def selective_context_fn(module, path):\n"
       "    \"\"\"The context_fn of `module`'s checkpoint (at `path`): a policy with its own matmul count per call.\"\"\"\n"
       "    save = {op for op in map(_op, SAVE_OPS) if op is not None}\n"
       "    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)\n"
       "    forced = set()\n"
       "    for name, sub in module.named_modules():\n"
       "        fqn = f\"{path}.{name}\" if path else name\n"
       "        if isinstance(sub, torch.nn.Linear) and any(f in fqn for f in RECOMPUTE_MM_FQNS):\n"
       "            out_features, in_features = sub.weight.shape\n"
       "            forced.add((in_features, out_features))\n"
       "\n"
       "    def policy_fn(count):\n"
       "        def policy(ctx, func, *args, **kwargs):\n"
       "            if not TORCHTITAN_POLICY:\n"
       "                return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE\n"
       "            if (func == torch.ops.aten._to_copy.default and \"cuda\" in str(args[0].device)\n"
       "                    and str(kwargs.get(\"device\")) == \"cpu\"):\n"
       "                return CheckpointPolicy.MUST_SAVE  # torchtitan keeps offloaded copies\n"
       "            mode = \"recompute\" if ctx.is_recompute else \"forward\"\n"
       "            if func in mm_ops:\n"
       "                shape = tuple(args[1].shape)\n"
       "                if func == torch.ops.aten.linear.default:\n"
       "                    shape = (shape[1], shape[0])\n"
       "                if shape in forced:\n"
       "                    return CheckpointPolicy.PREFER_RECOMPUTE\n"
       "                count[mode] += 1\n"
       "            if func in save and not (func in mm_ops and count[mode] % 2 == 0):\n"
       "                return CheckpointPolicy.MUST_SAVE\n"
       "            return CheckpointPolicy.PREFER_RECOMPUTE\n"
       "        return policy\n"
       "\n"
       "    def context_fn():\n"
       "        # allow_cache_entry_mutation: Hugging Face's MoE routers normalise the saved top-k\n"
       "        # weights in place, which the default check refuses in backward; memory is the same.\n"
       "        return create_selective_checkpoint_contexts(\n"
       "            policy_fn({\"forward\": 0, \"recompute\": 0}), allow_cache_entry_mutation=True\n"
       "        )\n"
       "\n"
       "    return context_fn\n";
  return o;
}

std::string selective_ac_apply(const std::string& model_var) {
  return "    def wrapper(module):\n"
         "        context_fn = selective_context_fn(module, checkpointed[id(module)])\n"
         "        # early_stop=False: the whole call is recomputed, as torchtitan's SelectiveAC and the plan.\n"
         "        return checkpoint_wrapper(module, preserve_rng_state=False, context_fn=context_fn, early_stop=False)\n"
         "\n"
         "    apply_activation_checkpointing(\n"
         "        " + model_var + ", checkpoint_wrapper_fn=wrapper, check_fn=lambda module: id(module) in checkpointed\n"
         "    )\n";
}

}  // namespace fsdp_plan
