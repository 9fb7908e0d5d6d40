// Parsing JSON that comes from files (meta.json, config.json, trainer state, safetensors
// headers), with its nesting depth bounded first.
//
// Why: every file tetrad reads is a few levels deep, but a damaged or hostile one can be nested
// arbitrarily; nlohmann::json's recursive operations (dump, copy, comparison) then overflow the
// stack and the process dies with a segfault instead of an error naming the file. The check is a
// linear scan of the text (brackets outside strings), before the parser sees it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tetrad {

constexpr int kMaxJsonDepth = 64;

// Throws Error naming `what` (a file) when `text` nests arrays/objects deeper than max_depth.
void check_json_depth(std::string_view text, const std::string& what, int max_depth = kMaxJsonDepth);

// check_json_depth, then nlohmann::json::parse; a syntax error becomes an Error naming `what`.
nlohmann::json parse_json_file_text(std::string_view text, const std::string& what,
                                    int max_depth = kMaxJsonDepth);

}  // namespace tetrad
