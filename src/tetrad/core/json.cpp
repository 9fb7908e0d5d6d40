#include "tetrad/core/json.hpp"

#include "tetrad/core/error.hpp"

namespace tetrad {

void check_json_depth(std::string_view text, const std::string& what, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        fail(what, ": JSON nested more than ", max_depth, " levels deep (at byte ", i,
             "); the file is damaged or not one tetrad wrote (its files are a few levels deep)");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

nlohmann::json parse_json_file_text(std::string_view text, const std::string& what, int max_depth) {
  check_json_depth(text, what, max_depth);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    fail(what, " is not valid JSON: ", e.what());
  }
}

}  // namespace tetrad
