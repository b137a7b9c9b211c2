// --emit torch with "activation_checkpointing": {"mode": "selective"}: the
// Python that checkpoints as the plan does (activations/selective.h), for the
// FSDP1 and FSDP2 forms. torchtitan's policy is written out as torchtitan
// 0.3.0 builds it (torchtitan/distributed/activation_checkpoint.py:
// SelectiveAC._wrap_block), a list policy as the list given to
// torch.utils.checkpoint.create_selective_checkpoint_contexts.
#pragma once

#include <string>

#include "policy/policy.h"

namespace fsdp_plan {

// Module-level code: the imports the policy needs past the checkpoint
// wrapper's (torch, CheckpointPolicy, create_selective_checkpoint_contexts).
std::string selective_ac_imports();

// Module-level code: SAVE_OPS, RECOMPUTE_MM_FQNS and selective_context_fn(module,
// path), the context_fn of one checkpointed module (a fresh policy, with its
// own matmul count, for every call, as torchtitan's).
std::string selective_ac_definitions(const ActivationCheckpointing& ac);

// apply_fsdp's lines that checkpoint `model_var`'s CHECKPOINTED modules
// selectively (non-reentrant checkpoint_wrapper, early_stop=False as
// torchtitan's default), indented by four spaces. `checkpointed` must be a
// dict from id(module) to its path, built before any wrapping.
std::string selective_ac_apply(const std::string& model_var);

}  // namespace fsdp_plan
