// Messages can quote names from a corrupt file: keep them one line of ASCII.
#pragma once

#include <string>

namespace fsdp_plan {

// s with every byte outside printable ASCII written as \xNN.
std::string printable(const std::string& s);

}  // namespace fsdp_plan
