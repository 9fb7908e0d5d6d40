// check_sizes SRC_DIR: fails (exit 1) on a function or a file in src/ longer than the limits
// below, unless it is a known offender (kKnownOffenders). CTest runs it over src/ (test Sizes);
// tests/sizes_planted.sh proves that it catches a planted long function, a long file, and a
// known offender that has shrunk (docs/layout.md, "Sizes").
//
// Limits (lines, the opening and closing brace's lines included):
//   a function in src/                      250
//   a function in src/tetrad/train/         150
//   a file in src/                          900, except a kernel file that holds one family of
//                                            kernels (kKernelFamilyFiles)
//
// Known offenders: too long today and still to be split. A listed one is reported as known, not
// as a failure; an unlisted one fails, and so does a listed one that is no longer too long (or no
// longer there): "remove it from the list". So the list can only shrink, as kKnownCircles in
// check_layering.cpp.
//
// How functions are found (a brace-matching scan, not a C++ parser):
//   - comments, string and character literals (raw strings too) and preprocessor lines are
//     blanked first, so braces in them do not count;
//   - a '{' directly in a namespace, class, struct, union or enum body or at file level opens a
//     function body when the text before it (since the last ';', '{' or '}' there) holds a '(' and
//     is not a namespace/class/struct/union/enum head or an '= {' initializer; a constructor's
//     member initialisers written with braces (": a_{x}, b_(y) {") stay part of the head;
//   - a function's length runs from its opening to its closing brace; lambdas and local classes
//     count towards the function that holds them; a function inside a function is not separate.
// Limits of the scan: braces that #if/#else branches leave unbalanced would mislead it (src/ has
// none: the scan reports an unbalanced file as a problem); a member function declared on one
// line and defined elsewhere is measured where it is defined; macros that expand to a function
// body are not seen; a variable at namespace scope initialised with a lambda ("auto f = [](...)
// {...};") is not measured.
//
// Output: every function and file over its limit (known or not), then problems, then a verdict.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "check_sources.hpp"

namespace fs = std::filesystem;

namespace {

constexpr int kFunctionLimit = 250;
constexpr int kTrainFunctionLimit = 150;
constexpr int kFileLimit = 900;

// Files that hold one family of kernels: exempt from the file limit (not from the function
// limits). Paths relative to src/.
const std::set<std::string> kKernelFamilyFiles = {};

struct Offender {
  const char* file;      // relative to src/
  const char* function;  // qualified name as reported ("tetrad::train"); "" for the file itself
};

// Too long today, to be split (issue 27). May only shrink.
const std::vector<Offender> kKnownOffenders = {
};

struct Found {
  std::string file, function;  // function "" for the file itself
  int line = 0, lines = 0, limit = 0;
};

// Comments, literals and preprocessor lines replaced by spaces (newlines kept).
std::string blank_non_code(const std::string& s) {
  std::string out = s;
  const size_t n = s.size();
  size_t i = 0;
  bool line_start = true;  // only whitespace so far on this line
  auto blank = [&](size_t from, size_t to) {
    for (size_t k = from; k < to && k < n; ++k)
      if (out[k] != '\n') out[k] = ' ';
  };
  while (i < n) {
    const char c = s[i];
    if (c == '\n') {
      line_start = true;
      ++i;
      continue;
    }
    if (line_start && c == '#') {  // a preprocessor line and its continuations
      size_t j = i;
      while (j < n && s[j] != '\n') {
        if (s[j] == '\\' && j + 1 < n && s[j + 1] == '\n') {
          j += 2;
        } else if (s[j] == '/' && j + 1 < n && s[j + 1] == '*') {  // a comment inside, even over lines
          const size_t e = s.find("*/", j + 2);
          j = e == std::string::npos ? n : e + 2;
        } else {
          ++j;
        }
      }
      blank(i, j);
      i = j;
      continue;
    }
    if (!std::isspace(static_cast<unsigned char>(c))) line_start = false;
    if (c == '/' && i + 1 < n && s[i + 1] == '/') {
      size_t j = s.find('\n', i);
      if (j == std::string::npos) j = n;
      blank(i, j);
      i = j;
    } else if (c == '/' && i + 1 < n && s[i + 1] == '*') {
      size_t j = s.find("*/", i + 2);
      j = j == std::string::npos ? n : j + 2;
      blank(i, j);
      i = j;
    } else if (c == 'R' && i + 1 < n && s[i + 1] == '"' &&
               (i == 0 || !(std::isalnum(static_cast<unsigned char>(s[i - 1])) || s[i - 1] == '_') ||
                s[i - 1] == '8' || s[i - 1] == 'u' || s[i - 1] == 'U' || s[i - 1] == 'L')) {
      const size_t open = s.find('(', i + 2);
      if (open == std::string::npos) break;
      const std::string end = std::string(")").append(s, i + 2, open - i - 2).append("\"");
      size_t j = s.find(end, open);
      j = j == std::string::npos ? n : j + end.size();
      blank(i, j);
      i = j;
    } else if (c == '"' || c == '\'') {
      if (c == '\'') {  // a digit separator (1'000'000) is no character literal
        size_t k = i;
        while (k > 0 && (std::isalnum(static_cast<unsigned char>(s[k - 1])) || s[k - 1] == '_' ||
                         s[k - 1] == '\''))
          --k;
        if (k < i && std::isdigit(static_cast<unsigned char>(s[k]))) {
          ++i;
          continue;
        }
      }
      size_t j = i + 1;
      while (j < n && s[j] != c && s[j] != '\n') j += s[j] == '\\' ? 2 : 1;
      blank(i, std::min(n, j + 1));
      i = j + 1;
    } else {
      ++i;
    }
  }
  return out;
}

bool has_word(const std::string& text, const std::string& word) {
  for (size_t p = text.find(word); p != std::string::npos; p = text.find(word, p + 1)) {
    const bool before = p == 0 || !(std::isalnum(static_cast<unsigned char>(text[p - 1])) || text[p - 1] == '_');
    const size_t e = p + word.size();
    const bool after = e >= text.size() || !(std::isalnum(static_cast<unsigned char>(text[e])) || text[e] == '_');
    if (before && after) return true;
  }
  return false;
}

// "template <class T, int N> void f(...)" -> " void f(...)": template heads hold 'class'.
std::string drop_template_heads(const std::string& head) {
  std::string out;
  size_t i = 0;
  while (i < head.size()) {
    if (head.compare(i, 8, "template") == 0 &&
        (i == 0 || !(std::isalnum(static_cast<unsigned char>(head[i - 1])) || head[i - 1] == '_'))) {
      size_t j = i + 8;
      while (j < head.size() && std::isspace(static_cast<unsigned char>(head[j]))) ++j;
      if (j < head.size() && head[j] == '<') {
        int depth = 0;
        for (; j < head.size(); ++j) {
          if (head[j] == '<') ++depth;
          else if (head[j] == '>' && --depth == 0) break;
        }
        i = j + 1;
        continue;
      }
    }
    out += head[i++];
  }
  return out;
}

// The text before the first top-level '(' ends in the function's name: "tetrad::Foo::bar".
std::string function_name(const std::string& head) {
  const size_t paren = head.find('(');
  std::string before = head.substr(0, paren);
  size_t e = before.size();
  while (e > 0 && std::isspace(static_cast<unsigned char>(before[e - 1]))) --e;
  size_t b = e;
  while (b > 0) {
    const char ch = before[b - 1];
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == ':' || ch == '~') --b;
    else if (ch == '=' || ch == '<' || ch == '>' || ch == '[' || ch == ']' || ch == '!' ||
             ch == '+' || ch == '-' || ch == '*' || ch == '/' || ch == '&' || ch == '|') {
      // operator symbols: keep them when the word before is `operator`
      size_t k = b - 1;
      while (k > 0 && !std::isspace(static_cast<unsigned char>(before[k - 1])) &&
             !std::isalnum(static_cast<unsigned char>(before[k - 1])))
        --k;
      if (k >= 8 && before.compare(k - 8, 8, "operator") == 0) b = k;
      else break;
    } else {
      break;
    }
  }
  std::string name = before.substr(b, e - b);
  return name.empty() ? "(unnamed)" : name;
}

enum class Kind { Scope, Function, Other, InitBrace };

// Every function body of one file, with its first line and length in lines.
void scan_functions(const std::string& code, const std::string& rel, int limit,
                    std::vector<Found>& too_long, std::vector<std::string>& problems) {
  struct Open {
    Kind kind;
    int line;
    std::string name;
    std::string qualifier;  // namespace or class name this scope adds ("" for none)
  };
  std::vector<Open> stack;
  std::string head;
  int line = 1;
  auto in_function = [&] {
    for (const auto& o : stack)
      if (o.kind == Kind::Function) return true;
    return false;
  };
  for (char c : code) {
    if (c == '\n') ++line;
    if (c == '{') {
      if (in_function()) {
        stack.push_back({Kind::Other, line, "", ""});
        continue;
      }
      const std::string h = drop_template_heads(head);
      const size_t paren = h.find('(');
      const std::string before_paren = h.substr(0, paren);
      std::string trimmed = h;
      while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back()))) trimmed.pop_back();
      const bool type_head = has_word(before_paren, "namespace") || has_word(before_paren, "class") ||
                             has_word(before_paren, "struct") || has_word(before_paren, "union") ||
                             has_word(before_paren, "enum") ||
                             (has_word(h, "extern") && paren == std::string::npos);
      const bool initializer = before_paren.find('=') != std::string::npos &&
                               !has_word(before_paren, "operator");
      // ": a_{x}" in a constructor's initialiser list: a '(' ... ')' ':' head whose last word
      // is a member name right before the brace.
      const size_t close = h.rfind(')');
      const bool after_init_colon =
          paren != std::string::npos && close != std::string::npos &&
          [&] {
            for (size_t k = close; k < h.size(); ++k)
              if (h[k] == ':' && (k + 1 >= h.size() || h[k + 1] != ':') && (k == 0 || h[k - 1] != ':'))
                return true;
            return false;
          }() &&
          !trimmed.empty() && (std::isalnum(static_cast<unsigned char>(trimmed.back())) ||
                               trimmed.back() == '_' || trimmed.back() == '>');
      if (type_head) {
        // The name a namespace, class, struct or union adds to its functions' names ("" when
        // anonymous): the word after the keyword, before a base clause.
        std::string q;
        std::istringstream ws(before_paren);
        bool next = false;
        for (std::string w; ws >> w;) {
          if (next) {
            if (w != "{" && w != ":" && w[0] != ':') q = w.substr(0, w.find(':') == 0 ? 0 : w.size());
            break;
          }
          next = w == "namespace" || w == "class" || w == "struct" || w == "union";
        }
        if (q.size() > 1 && q.back() == ':' && q[q.size() - 2] != ':') q.pop_back();  // "X:" of "X: Base"
        if (has_word(before_paren, "enum") || has_word(before_paren, "extern")) q.clear();
        stack.push_back({Kind::Scope, line, "", q});
        head.clear();
      } else if (after_init_colon && !initializer) {
        stack.push_back({Kind::InitBrace, line, "", ""});
        head += c;
      } else if (paren != std::string::npos && !initializer) {
        std::string name;
        for (const auto& o : stack)
          if (o.kind == Kind::Scope && !o.qualifier.empty()) name += o.qualifier + "::";
        name += function_name(h);
        stack.push_back({Kind::Function, line, name, ""});
        head.clear();
      } else {
        stack.push_back({Kind::Other, line, "", ""});
        head.clear();
      }
      continue;
    }
    if (c == '}') {
      if (stack.empty()) {
        problems.push_back("unbalanced braces: " + rel + ":" + std::to_string(line) +
                           " closes a brace that was not opened (#if branches?)");
        return;
      }
      const Open o = stack.back();
      stack.pop_back();
      if (o.kind == Kind::InitBrace) {
        head += c;
        continue;
      }
      if (o.kind == Kind::Function) {
        const int lines = line - o.line + 1;
        if (lines > limit) too_long.push_back({rel, o.name, o.line, lines, limit});
      }
      if (!in_function()) head.clear();
      continue;
    }
    if (in_function()) continue;
    if (c == ';') head.clear();
    else head += c == '\n' ? ' ' : c;
  }
  if (!stack.empty())
    problems.push_back("unbalanced braces: " + rel + ": " + std::to_string(stack.size()) +
                       " brace(s) still open at the end (#if branches?)");
}

}  // namespace

int main(int argc, char** argv) {
  const check_sources::SourceTree tree = check_sources::source_tree(argc, argv, "check_sizes");
  const fs::path& root = tree.root;
  const std::vector<std::string>& files = tree.files;

  std::vector<Found> too_long;
  std::vector<std::string> problems;
  int functions_scanned = 0;
  for (const auto& f : files) {
    std::ifstream in(root / f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const int lines = int(std::count(text.begin(), text.end(), '\n')) +
                      (!text.empty() && text.back() != '\n' ? 1 : 0);
    if (lines > kFileLimit && !kKernelFamilyFiles.count(f))
      too_long.push_back({f, "", 1, lines, kFileLimit});
    const int limit = f.rfind("tetrad/train/", 0) == 0 ? kTrainFunctionLimit : kFunctionLimit;
    std::vector<Found> all;
    scan_functions(blank_non_code(text), f, 0, all, problems);
    functions_scanned += int(all.size());
    for (const auto& g : all)
      if (g.lines > limit) too_long.push_back({g.file, g.function, g.line, g.lines, limit});
  }

  std::vector<std::string> known, failures, stale;
  std::vector<bool> offender_seen(kKnownOffenders.size(), false);
  for (const auto& t : too_long) {
    std::ostringstream os;
    if (t.function.empty())
      os << "file " << t.file << ": " << t.lines << " lines (limit " << t.limit << ")";
    else
      os << "function " << t.function << " at " << t.file << ":" << t.line << ": " << t.lines
         << " lines (limit " << t.limit << ")";
    bool listed = false;
    for (size_t k = 0; k < kKnownOffenders.size(); ++k)
      if (t.file == kKnownOffenders[k].file && t.function == kKnownOffenders[k].function) {
        listed = true;
        offender_seen[k] = true;
      }
    (listed ? known : failures).push_back(os.str());
  }
  for (size_t k = 0; k < kKnownOffenders.size(); ++k)
    if (!offender_seen[k]) {
      const Offender& o = kKnownOffenders[k];
      stale.push_back(std::string("known offender ") +
                         (*o.function ? std::string("function ") + o.function + " in " + o.file
                                      : std::string("file ") + o.file) +
                         " is no longer too long (or no longer there): remove it from the list "
                         "(tests/check_sizes.cpp, kKnownOffenders)");
    }

  std::cout << "limits: a function in src/ " << kFunctionLimit << " lines, in src/tetrad/train/ "
            << kTrainFunctionLimit << ", a file " << kFileLimit
            << " (kernel-family files exempt)\n"
            << files.size() << " files, " << functions_scanned << " functions\n\n";
  for (const auto& k : known) std::cout << "known: " << k << "\n";
  for (const auto& f : failures) std::cout << "too long: " << f << "\n";
  for (const auto& s : stale) std::cout << "stale: " << s << "\n";
  for (const auto& p : problems) std::cout << "problem: " << p << "\n";
  if (!failures.empty() || !stale.empty() || !problems.empty()) {
    std::cout << "FAIL: " << failures.size() << " too long, " << stale.size()
              << " stale known offender(s), " << problems.size()
              << " scan problem(s); " << known.size() << " known offender(s)\n";
    return 1;
  }
  std::cout << "ok: nothing too long beyond the " << known.size() << " known offender(s)\n";
  return 0;
}
