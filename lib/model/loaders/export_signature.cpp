#include "model/loaders/export_walk.h"

#include <utility>

namespace fsdp_plan::pt2 {

void ProgramWalk::graph_inputs(dom::element v) {
  if (!v.is_array()) return;
  for_elements(v, [&](dom::element a) {
    union_of(a, "a graph input", [&](std::string_view k, dom::element x) {
      if (k == "as_tensor") {
        const ValueId t = tensor_name(x, "a graph input");
        if (t != kNone) g_.add_placeholder(t);
      } else if (k == "as_sym_int") {
        union_of(x, "a graph input", [&](std::string_view sk, dom::element sx) {
          std::string_view s;
          if (sk == "as_name" && read_string(sx, s)) g_.add_placeholder(g_.value(s));
        });
      }
    });
  });
}

void ProgramWalk::signature(dom::element v) {
  if (!v.is_object()) return;
  for_fields(v, {"input_specs", "output_specs"}, [&](std::string_view k, dom::element x) {
    if (k == "input_specs" && x.is_array()) {
      raw_.specs = true;
      for_elements(x, [&](dom::element s) { input_spec(s); });
    }
    if (k == "output_specs" && x.is_array()) {
      for_elements(x, [&](dom::element s) { output_spec(s); });
    }
  });
}

// {"name": ...} of an arg, as a string.
std::optional<std::string> ProgramWalk::arg_name(dom::element v) {
  std::optional<std::string> out;
  if (!v.is_object()) return out;
  for_fields(v, {"name"}, [&](std::string_view k, dom::element x) {
    std::string_view s;
    if (k == "name" && read_string(x, s)) out = std::string(s);
  });
  return out;
}

// The value an Argument union names (as_tensor, as_sym_int), or kNone.
ValueId ProgramWalk::argument_value(dom::element v, const What& what) {
  ValueId out = kNone;
  union_of(v, what, [&](std::string_view k, dom::element x) {
    if (k == "as_tensor") {
      out = tensor_name(x, what);
    } else if (k == "as_sym_int") {
      union_of(x, what, [&](std::string_view sk, dom::element sx) {
        std::string_view s;
        if (sk == "as_name" && read_string(sx, s)) out = g_.value(s);
      });
    }
  });
  return out;
}

void ProgramWalk::input_spec(dom::element v) {
  RawSpec spec;
  const What what("input spec ", raw_.input_specs.size(), "");
  if (v.is_object()) {
    for_fields(v, {"user_input", "parameter", "buffer", "tensor_constant", "custom_obj", "token", "constant_input"},
               [&](std::string_view kind, dom::element body) {
                 GraphInput in;
                 std::optional<std::string> name, target;
                 if (!body.is_object()) {
                   g_.damage(what + " is not an object");
                   return;
                 }
                 ValueId value = kNone;
                 for_fields(body, {"arg", "parameter_name", "buffer_name", "persistent", "tensor_constant_name",
                                   "custom_obj_name", "name"},
                            [&](std::string_view k, dom::element x) {
                              std::string_view s;
                              if (k == "arg") {
                                if (kind == "user_input") {
                                  value = argument_value(x, what);
                                } else {
                                  name = arg_name(x);
                                  if (name) value = g_.value(*name);
                                }
                              } else if (k == "persistent") {
                                bool b = true;
                                if (read_bool(x, b)) spec.persistent = b;
                              } else if (k != "name" || kind == "constant_input") {
                                if (read_string(x, s)) target = std::string(s);
                              }
                            });
                 in.value = value;
                 if (kind == "parameter") {
                   spec.parameter = true;
                   spec.parameter_name = target;
                   spec.parameter_arg = name.value_or("");
                   in.kind = InputKind::Parameter;
                 } else if (kind == "buffer") {
                   spec.buffer = true;
                   spec.buffer_name = target;
                   spec.buffer_arg = name.value_or("");
                   in.kind = InputKind::Buffer;
                   in.persistent = spec.persistent.value_or(true);
                 } else if (kind == "tensor_constant") {
                   in.kind = InputKind::TensorConstant;
                 } else if (kind == "custom_obj") {
                   in.kind = InputKind::CustomObj;
                 } else if (kind == "token") {
                   in.kind = InputKind::Token;
                 } else if (kind == "constant_input") {
                   in.kind = InputKind::ConstantInput;
                   in.value = kNone;
                 } else if (kind == "user_input") {
                   in.kind = InputKind::UserInput;
                   if (value != kNone) target = g_.value_name(value);
                 } else {
                   return;  // a kind of a newer schema: not a placeholder this reader knows
                 }
                 if (target) in.target = g_.intern(*target);
                 g_.add_input(in);
               });
  }
  raw_.input_specs.push_back(std::move(spec));
}

void ProgramWalk::output_spec(dom::element v) {
  const What what = "output spec";
  union_of(v, what, [&](std::string_view kind, dom::element body) {
    static const std::pair<std::string_view, OutputKind> kKinds[] = {
        {"user_output", OutputKind::UserOutput},
        {"loss_output", OutputKind::LossOutput},
        {"buffer_mutation", OutputKind::BufferMutation},
        {"gradient_to_parameter", OutputKind::GradientToParameter},
        {"gradient_to_user_input", OutputKind::GradientToUserInput},
        {"user_input_mutation", OutputKind::UserInputMutation},
        {"token", OutputKind::Token},
        {"parameter_mutation", OutputKind::ParameterMutation}};
    GraphOutput out;
    bool known = false;
    for (const auto& [name, k] : kKinds) {
      if (name == kind) {
        out.kind = k;
        known = true;
      }
    }
    if (!known || !body.is_object()) return;
    for_fields(body, {"arg", "buffer_name", "parameter_name", "user_input_name"}, [&](std::string_view k, dom::element x) {
      std::string_view s;
      if (k == "arg") {
        if (out.kind == OutputKind::UserOutput) {
          out.value = argument_value(x, what);
        } else if (auto n = arg_name(x)) {
          out.value = g_.value(*n);
        }
      } else if (read_string(x, s)) {
        out.target = g_.intern(s);
      }
    });
    g_.add_output_spec(out);
  });
}

}  // namespace fsdp_plan::pt2
