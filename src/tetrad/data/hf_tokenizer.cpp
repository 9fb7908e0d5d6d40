#include "tetrad/data/hf_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "tetrad/core/error.hpp"
#include "tetrad/data/utf8.hpp"

namespace tetrad::data {

namespace {

using json = nlohmann::json;

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

// GPT-2's pre-tokenizer regex (the `tokenizers` ByteLevel pre-tokenizer with use_regex).
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---- reading the JSON --------------------------------------------------------------------------

[[noreturn]] void refuse(const std::string& where, const std::string& what) {
  fail("tokenizer '", where, "': ", what, " is not implemented by tetrad (docs/data.md lists what is)");
}

void check_keys(const json& obj, std::initializer_list<const char*> allowed, const std::string& where,
                const std::string& what) {
  if (!obj.is_object()) fail("tokenizer '", where, "': ", what, " must be a JSON object");
  for (const auto& [k, v] : obj.items()) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || k == a;
    if (!ok) refuse(where, what + " field '" + k + "'");
  }
}

bool get_bool(const json& obj, const char* key, bool dflt, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) fail("tokenizer '", where, "': '", key, "' must be true or false");
  return it->get<bool>();
}

std::string get_string(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string())
    fail("tokenizer '", where, "': '", key, "' must be a string");
  return it->get<std::string>();
}

std::string type_of(const json& obj, const std::string& where, const std::string& what) {
  if (!obj.is_object() || !obj.contains("type") || !obj["type"].is_string())
    fail("tokenizer '", where, "': ", what, " has no \"type\"");
  return obj["type"].get<std::string>();
}

// ---- regexes (Oniguruma syntax run on PCRE2) -----------------------------------------------------

std::string onig_to_pcre2(const std::string& p, const std::string& where) {
  static const std::string kSpace = R"(\t\n\x0B\f\r\x{85}\p{Zs}\x{2028}\x{2029})";
  static const std::string kWord = R"(\p{L}\p{M}\p{N}\p{Pc})";
  static const std::string kHex = "0-9a-fA-F";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      auto set = [&](const std::string& body, bool negated) {
        if (in_class) {
          if (negated)
            refuse(where, std::string("the regex escape \\") + e + " inside a character class");
          out += body;
        } else {
          out += negated ? "[^" : "[";
          out += body;
          out += ']';
        }
      };
      switch (e) {
        case 's': set(kSpace, false); break;
        case 'S': set(kSpace, true); break;
        case 'w': set(kWord, false); break;
        case 'W': set(kWord, true); break;
        case 'h': set(kHex, false); break;
        case 'H': set(kHex, true); break;
        case 'b': case 'B': case 'G': case 'K': case 'X': case 'R': case 'y': case 'Y': case 'O':
          refuse(where, std::string("the regex escape \\") + e);
        case 'u': {
          if (i + 4 >= p.size()) refuse(where, "a truncated \\u escape");
          out += "\\x{" + p.substr(i + 1, 4) + "}";
          i += 4;
          break;
        }
        default: out += c; out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a literal ']' first
      continue;
    }
    if (in_class && c == '[') {
      if (p.compare(i, 2, "[:") == 0) {  // POSIX class: copied through
        const size_t end = p.find(":]", i + 2);
        if (end == std::string::npos) fail("tokenizer '", where, "': unterminated [: in regex");
        out.append(p, i, end + 2 - i);
        i = end + 1;
        continue;
      }
      refuse(where, "a nested character class in a regex");
    }
    if (in_class && c == '&' && i + 1 < p.size() && p[i + 1] == '&')
      refuse(where, "character class intersection (&&) in a regex");
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// Per thread: a match context with a JIT stack big enough for long whitespace runs.
struct PcreThreadState {
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  PcreThreadState() {
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
    if (ctx && stack) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~PcreThreadState() {
    if (stack) pcre2_jit_stack_free(stack);
    if (ctx) pcre2_match_context_free(ctx);
  }
};

class Regex {
 public:
  Regex(const std::string& onig_pattern, bool literal, const std::string& where)
      : source_(onig_pattern) {
    const std::string pattern = literal ? onig_pattern : onig_to_pcre2(onig_pattern, where);
    int err = 0;
    PCRE2_SIZE off = 0;
    uint32_t flags = PCRE2_UTF | PCRE2_NO_UTF_CHECK;
    flags |= literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags, &err,
                          &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("tokenizer '", where, "': regex '", onig_pattern, "' does not compile (PCRE2 at offset ",
           off, " of '", pattern, "': ", reinterpret_cast<const char*>(msg), ")");
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All matches as the onig crate's find_iter yields them: left to right, non-overlapping; an
  // empty match right where the previous match ended is skipped.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    thread_local PcreThreadState ts;
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    if (!md) fail("out of memory for regex match data");
    size_t start = 0;
    std::optional<size_t> last_end;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start,
                                 PCRE2_NO_UTF_CHECK, md, ts.ctx);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        pcre2_match_data_free(md);
        fail("regex '", source_, "' failed on a text of ", s.size(), " bytes: ",
             reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (b == e && last_end && *last_end == e) {
        if (start >= s.size()) break;
        size_t bad = 0;
        const int n = utf8_sequence_length(s, start, &bad);
        start += n > 0 ? size_t(n) : 1;
        continue;
      }
      out.emplace_back(b, e);
      start = e;
      last_end = e;
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
  std::string source_;
};

// ---- normalization, byte-level alphabet ------------------------------------------------------

std::string nfc(const std::string& s) {
  bool ascii = true;
  for (unsigned char c : s) ascii = ascii && c < 0x80;
  if (ascii) return s;
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  if (U_FAILURE(err)) fail("ICU has no NFC normalizer: ", u_errorName(err));
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), int32_t(s.size())));
  const icu::UnicodeString r = n->normalize(u, err);
  if (U_FAILURE(err)) fail("NFC normalization failed: ", u_errorName(err));
  std::string out;
  r.toUTF8String(out);
  return out;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100...
struct ByteAlphabet {
  std::string byte_char[256];
  std::unordered_map<uint32_t, uint8_t> char_byte;
  ByteAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
      append_utf8(byte_char[b], cp);
      char_byte[cp] = uint8_t(b);
    }
  }
};
const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

uint32_t decode_cp(std::string_view s, size_t i, int n) {
  const auto b = [&](int k) { return uint32_t(static_cast<unsigned char>(s[i + size_t(k)])); };
  switch (n) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

int char_len(std::string_view s, size_t i) {
  size_t bad = 0;
  const int n = utf8_sequence_length(s, i, &bad);
  return n > 0 ? n : 1;
}

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokenizerStep {
  bool byte_level = false;
  bool add_prefix_space = false;
  std::shared_ptr<Regex> regex;  // ByteLevel with use_regex, or Split
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
};

struct AddedToken {
  std::string content;
  std::string match;  // what is looked for: content, NFC-normalized for a normalized token
  int32_t id = 0;
  bool special = false, normalized = false;
};

std::atomic<uint64_t> g_instances{0};

}  // namespace

struct HfTokenizer::Impl {
  std::string where;
  uint64_t serial = 0;
  StringMap vocab;
  std::vector<std::string> id_to_token;   // the model's vocab; empty string: no token
  std::vector<bool> has_token;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, merged)
  int32_t unk = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::vector<AddedToken> added;  // all of them
  std::unordered_map<int32_t, size_t> added_by_id;
  std::vector<size_t> raw_added, normalized_added;  // indices into added, longest first
  bool nfc = false;
  std::vector<PreTokenizerStep> pre;
  std::vector<int32_t> prefix, suffix;
  int vocab_size = 0;

  // ---- encoding ----
  // Splits `text` on the added tokens `which` (leftmost, then longest): calls text(piece) for the
  // text between them and token(id) for each.
  void split_added(std::string_view s, const std::vector<size_t>& which,
                   const std::function<void(std::string_view)>& on_text,
                   const std::function<void(int32_t)>& on_token) const {
    if (which.empty()) {
      if (!s.empty()) on_text(s);
      return;
    }
    size_t from = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const AddedToken* hit = nullptr;
      for (size_t k : which) {
        const AddedToken& a = added[k];
        if (a.match.size() <= s.size() - i && s.compare(i, a.match.size(), a.match) == 0) {
          hit = &a;
          break;  // `which` is sorted longest first
        }
      }
      if (!hit) continue;
      if (i > from) on_text(s.substr(from, i - from));
      on_token(hit->id);
      i += hit->match.size() - 1;
      from = i + 1;
    }
    if (from < s.size()) on_text(s.substr(from));
  }

  std::vector<std::string> pre_tokenize(std::string text) const {
    std::vector<std::string> pieces;
    if (!text.empty()) pieces.push_back(std::move(text));
    for (const PreTokenizerStep& st : pre) {
      std::vector<std::string> next;
      for (std::string& piece : pieces) {
        if (st.byte_level && st.add_prefix_space && piece[0] != ' ') piece.insert(0, 1, ' ');
        std::vector<std::string> parts;
        if (st.regex) {
          split(piece, st, parts);
        } else {
          parts.push_back(std::move(piece));
        }
        for (std::string& part : parts) {
          if (st.byte_level) {
            std::string mapped;
            mapped.reserve(part.size() * 2);
            for (unsigned char c : part) mapped += byte_alphabet().byte_char[c];
            part = std::move(mapped);
          }
          next.push_back(std::move(part));
        }
      }
      pieces = std::move(next);
    }
    return pieces;
  }

  // NormalizedString::split of the library: the regex's matches and the text between them,
  // combined as the behavior says; empty pieces dropped.
  void split(const std::string& s, const PreTokenizerStep& st, std::vector<std::string>& out) const {
    struct Span { size_t b, e; bool match; };
    std::vector<Span> spans;
    if (s.empty()) {
      spans.push_back({0, 0, false});
    } else {
      size_t prev = 0;
      for (auto [b, e] : st.regex->find_all(s)) {
        if (prev != b) spans.push_back({prev, b, false});
        spans.push_back({b, e, true});
        prev = e;
      }
      if (prev != s.size()) spans.push_back({prev, s.size(), false});
    }
    if (st.invert)
      for (auto& sp : spans) sp.match = !sp.match;
    std::vector<Span> kept;  // match = remove
    switch (st.behavior) {
      case Behavior::Isolated:
        for (auto sp : spans) kept.push_back({sp.b, sp.e, false});
        break;
      case Behavior::Removed: kept = spans; break;
      case Behavior::Contiguous: {
        bool previous = false;
        for (auto sp : spans) {
          if (sp.match == previous && !kept.empty()) kept.back().e = sp.e;
          else kept.push_back({sp.b, sp.e, false});
          previous = sp.match;
        }
        break;
      }
      case Behavior::MergedWithPrevious: {
        bool previous = false;
        for (auto sp : spans) {
          if (sp.match && !previous && !kept.empty()) kept.back().e = sp.e;
          else kept.push_back({sp.b, sp.e, false});
          previous = sp.match;
        }
        break;
      }
      case Behavior::MergedWithNext: {
        bool previous = false;
        for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
          if (it->match && !previous && !kept.empty()) kept.back().b = it->b;
          else kept.push_back({it->b, it->e, false});
          previous = it->match;
        }
        std::reverse(kept.begin(), kept.end());
        break;
      }
    }
    for (auto sp : kept)
      if (!sp.match && sp.e > sp.b) out.push_back(s.substr(sp.b, sp.e - sp.b));
  }

  // The BPE model on one pre-token (the library's BPE::tokenize and Word::merge_all).
  void bpe(std::string_view w, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      auto it = vocab.find(w);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    struct Sym { int32_t id; int prev, next; size_t len; };
    std::vector<Sym> sym;
    sym.reserve(w.size());
    auto add = [&](int32_t id, size_t len) {
      const int n = int(sym.size());
      sym.push_back({id, n - 1, -1, len});
      if (n > 0) sym[size_t(n - 1)].next = n;
    };
    int32_t unk_pending = -1;  // an unknown-character token not yet added, and its length
    size_t unk_len = 0;
    char hex[8];
    for (size_t i = 0; i < w.size();) {
      const size_t n = size_t(char_len(w, i));
      const std::string_view c = w.substr(i, n);
      i += n;
      auto it = vocab.find(c);
      if (it != vocab.end()) {
        if (unk_pending >= 0) add(unk_pending, unk_len);
        unk_pending = -1;
        add(it->second, n);
        continue;
      }
      if (byte_fallback) {
        std::vector<int32_t> bytes;
        for (unsigned char b : c) {
          std::snprintf(hex, sizeof hex, "<0x%02X>", b);
          auto bt = vocab.find(std::string_view(hex));
          if (bt == vocab.end()) break;
          bytes.push_back(bt->second);
        }
        if (bytes.size() == c.size()) {
          // As the library: the byte tokens go in without flushing a pending unk first.
          for (int32_t b : bytes) add(b, 1);
          continue;
        }
      }
      if (unk >= 0) {
        if (unk_pending >= 0 && fuse_unk) {
          unk_len += n;
        } else {
          if (unk_pending >= 0) add(unk_pending, unk_len);
          unk_pending = unk;
          unk_len = n;
        }
      }
    }
    if (unk_pending >= 0) add(unk_pending, unk_len);

    struct Merge {
      size_t pos;
      int32_t rank, new_id;
      bool operator<(const Merge& o) const {  // max-heap order: lowest rank, then leftmost first
        if (rank != o.rank) return rank > o.rank;
        return pos > o.pos;
      }
    };
    auto find_merge = [&](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
      auto it = merges.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
      return it == merges.end() ? nullptr : &it->second;
    };
    std::priority_queue<Merge> queue;
    for (size_t i = 0; i + 1 < sym.size(); ++i)
      if (auto* m = find_merge(sym[i].id, sym[i + 1].id)) queue.push({i, m->first, m->second});
    while (!queue.empty()) {
      const Merge top = queue.top();
      queue.pop();
      Sym& cur = sym[top.pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const size_t next_pos = size_t(cur.next);
      const Sym right = sym[next_pos];
      const auto* m = find_merge(cur.id, right.id);
      if (!m || m->second != top.new_id) continue;  // an expired entry
      cur.id = top.new_id;
      cur.len += right.len;
      cur.next = right.next;
      sym[next_pos].len = 0;
      if (right.next >= 0) sym[size_t(right.next)].prev = int(top.pos);
      if (cur.prev >= 0)
        if (auto* pm = find_merge(sym[size_t(cur.prev)].id, cur.id))
          queue.push({size_t(cur.prev), pm->first, pm->second});
      if (cur.next >= 0)
        if (auto* nm = find_merge(cur.id, sym[size_t(cur.next)].id))
          queue.push({top.pos, nm->first, nm->second});
    }
    for (const Sym& s : sym)
      if (s.len != 0) out.push_back(s.id);
  }

  void encode_words(std::string_view text, std::vector<int32_t>& out) const {
    // A per-thread cache of pre-tokens: documents repeat their words.
    struct Cache {
      uint64_t owner = ~0ull;
      std::unordered_map<std::string, std::vector<int32_t>, SvHash, std::equal_to<>> map;
    };
    thread_local Cache cache;
    if (cache.owner != serial) {
      cache.map.clear();
      cache.owner = serial;
    }
    for (const std::string& w : pre_tokenize(std::string(text))) {
      if (w.size() <= 64) {
        auto it = cache.map.find(w);
        if (it != cache.map.end()) {
          out.insert(out.end(), it->second.begin(), it->second.end());
          continue;
        }
        std::vector<int32_t> ids;
        bpe(w, ids);
        out.insert(out.end(), ids.begin(), ids.end());
        if (cache.map.size() >= 200000) cache.map.clear();
        cache.map.emplace(w, std::move(ids));
      } else {
        bpe(w, out);
      }
    }
  }
};

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

namespace {

// The post-processor: the single template's special tokens, before (prefix) and after (suffix)
// the text's.
void parse_post_processor(const json& p, const std::string& where, std::vector<int32_t>& prefix,
                          std::vector<int32_t>& suffix) {
  if (p.is_null()) return;
  const std::string type = type_of(p, where, "the post_processor");
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    check_keys(p, {"type", "processors"}, where, "the Sequence post_processor");
    if (!p.contains("processors") || !p["processors"].is_array())
      fail("tokenizer '", where, "': the Sequence post_processor has no \"processors\" array");
    for (const json& x : p["processors"]) parse_post_processor(x, where, prefix, suffix);
    return;
  }
  if (type != "TemplateProcessing")
    refuse(where, "post_processor '" + type + "' (ByteLevel, TemplateProcessing and Sequence are)");
  check_keys(p, {"type", "single", "pair", "special_tokens"}, where, "the TemplateProcessing post_processor");
  if (!p.contains("single") || !p["single"].is_array())
    fail("tokenizer '", where, "': TemplateProcessing has no \"single\" template");
  const json specials = p.value("special_tokens", json::object());
  bool seen_sequence = false;
  for (const json& item : p["single"]) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].is_object())
      fail("tokenizer '", where, "': a TemplateProcessing item is neither Sequence nor SpecialToken");
    const std::string name = get_string(item["SpecialToken"], "id", where);
    if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
      fail("tokenizer '", where, "': template token '", name, "' is not in special_tokens");
    for (const json& id : specials[name]["ids"]) {
      if (!id.is_number_integer()) fail("tokenizer '", where, "': special token '", name, "' has a bad id");
      (seen_sequence ? suffix : prefix).push_back(id.get<int32_t>());
    }
  }
}

// The decoder: whether it is byte-level (ByteLevel, alone or in a Sequence); refuses any other.
bool byte_level_decoder(const json& d, const std::string& where) {
  if (d.is_null()) return false;
  const std::string type = type_of(d, where, "the decoder");
  if (type == "ByteLevel") return true;
  if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
    bool any = false;
    for (const json& x : d["decoders"]) any = byte_level_decoder(x, where) || any;
    return any;
  }
  refuse(where, "decoder '" + type + "' (only ByteLevel is)");
}

}  // namespace

std::unique_ptr<HfTokenizer> HfTokenizer::parse(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text, [&](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth)
        fail("tokenizer '", where, "' is nested deeper than ", kMaxJsonDepth,
             " levels; a tokenizer.json is about 6 deep");
      return true;
    });
  } catch (const json::exception& e) {
    fail("tokenizer '", where, "' is not valid JSON: ", e.what());
  }
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.where = where;
  t.serial = g_instances.fetch_add(1);
  check_keys(j, {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                 "post_processor", "decoder", "model"},
             where, "the top level");
  for (const char* k : {"truncation", "padding"})
    if (j.contains(k) && !j[k].is_null())
      refuse(where, std::string("\"") + k + "\" (tetrad encodes whole documents; set it to null)");

  // model
  if (!j.contains("model")) fail("tokenizer '", where, "' has no \"model\"");
  const json& m = j["model"];
  const std::string mtype = m.is_object() && m.contains("type") ? type_of(m, where, "model") : "BPE";
  if (mtype != "BPE") refuse(where, "model type '" + mtype + "' (only BPE is)");
  check_keys(m, {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                 "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"},
             where, "the BPE model");
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
    refuse(where, "BPE dropout");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
      refuse(where, std::string("BPE ") + k);
  t.fuse_unk = get_bool(m, "fuse_unk", false, where);
  t.byte_fallback = get_bool(m, "byte_fallback", false, where);
  t.ignore_merges = get_bool(m, "ignore_merges", false, where);
  if (!m.contains("vocab") || !m["vocab"].is_object())
    fail("tokenizer '", where, "': the BPE model has no \"vocab\" object");
  int32_t max_id = -1;
  for (const auto& [tok, idj] : m["vocab"].items()) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() >= (1 << 30))
      fail("tokenizer '", where, "': vocab entry '", tok, "' has no valid id");
    const int32_t id = idj.get<int32_t>();
    t.vocab[tok] = id;
    max_id = std::max(max_id, id);
  }
  t.id_to_token.assign(size_t(max_id + 1), std::string());
  t.has_token.assign(size_t(max_id + 1), false);
  for (const auto& [tok, id] : t.vocab) {
    t.id_to_token[size_t(id)] = tok;
    t.has_token[size_t(id)] = true;
  }
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const std::string u = get_string(m, "unk_token", where);
    auto it = t.vocab.find(u);
    if (it == t.vocab.end()) fail("tokenizer '", where, "': unk_token '", u, "' is not in the vocab");
    t.unk = it->second;
  }
  if (m.contains("merges") && !m["merges"].is_null()) {
    if (!m["merges"].is_array()) fail("tokenizer '", where, "': \"merges\" must be an array");
    int32_t rank = 0;
    for (const json& mj : m["merges"]) {
      std::string a, b;
      if (mj.is_string()) {
        const std::string s = mj.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail("tokenizer '", where, "': merge ", rank, " '", s, "' is not two tokens separated by a space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
        a = mj[0].get<std::string>();
        b = mj[1].get<std::string>();
      } else {
        fail("tokenizer '", where, "': merge ", rank, " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      auto ia = t.vocab.find(a), ib = t.vocab.find(b), iab = t.vocab.find(a + b);
      if (ia == t.vocab.end() || ib == t.vocab.end() || iab == t.vocab.end())
        fail("tokenizer '", where, "': merge ", rank, " ('", a, "', '", b,
             "') names a token that is not in the vocab");
      t.merges[(uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second)] = {rank, iab->second};
      ++rank;
    }
  }

  // added tokens
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) fail("tokenizer '", where, "': \"added_tokens\" must be an array");
    for (const json& a : j["added_tokens"]) {
      check_keys(a, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"},
                 where, "an added token");
      AddedToken at;
      at.content = get_string(a, "content", where);
      if (!a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() >= (1 << 30))
        fail("tokenizer '", where, "': added token '", at.content, "' has no valid id");
      at.id = a["id"].get<int32_t>();
      at.special = get_bool(a, "special", false, where);
      at.normalized = get_bool(a, "normalized", !at.special, where);
      for (const char* k : {"single_word", "lstrip", "rstrip"})
        if (get_bool(a, k, false, where))
          refuse(where, std::string("added token '") + at.content + "' with " + k + " = true");
      if (at.content.empty()) fail("tokenizer '", where, "': an added token is empty");
      max_id = std::max(max_id, at.id);
      at.match = at.content;
      t.added_by_id[at.id] = t.added.size();
      t.added.push_back(at);
    }
  }
  t.vocab_size = max_id + 1;

  // normalizer
  std::function<void(const json&)> normalizer = [&](const json& n) {
    if (n.is_null()) return;
    const std::string type = type_of(n, where, "the normalizer");
    if (type == "NFC") {
      check_keys(n, {"type"}, where, "the NFC normalizer");
      t.nfc = true;
    } else if (type == "Sequence") {
      check_keys(n, {"type", "normalizers"}, where, "the Sequence normalizer");
      if (!n.contains("normalizers") || !n["normalizers"].is_array())
        fail("tokenizer '", where, "': the Sequence normalizer has no \"normalizers\" array");
      for (const json& x : n["normalizers"]) normalizer(x);
    } else {
      refuse(where, "normalizer '" + type + "' (only NFC is)");
    }
  };
  if (j.contains("normalizer")) normalizer(j["normalizer"]);
  for (size_t i = 0; i < t.added.size(); ++i) {
    // Normalized tokens are matched on normalized text, so they are normalized too.
    if (t.added[i].normalized && t.nfc) t.added[i].match = nfc(t.added[i].content);
  }
  for (size_t i = 0; i < t.added.size(); ++i)
    (t.added[i].normalized ? t.normalized_added : t.raw_added).push_back(i);
  for (auto* list : {&t.raw_added, &t.normalized_added})
    std::stable_sort(list->begin(), list->end(), [&](size_t x, size_t y) {
      return t.added[x].match.size() > t.added[y].match.size();
    });

  // pre-tokenizer
  std::shared_ptr<Regex> gpt2;
  std::function<void(const json&)> pre = [&](const json& p) {
    if (p.is_null()) return;
    const std::string type = type_of(p, where, "the pre_tokenizer");
    PreTokenizerStep st;
    if (type == "ByteLevel") {
      check_keys(p, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, where,
                 "the ByteLevel pre_tokenizer");
      st.byte_level = true;
      st.add_prefix_space = get_bool(p, "add_prefix_space", true, where);
      if (get_bool(p, "use_regex", true, where)) {
        if (!gpt2) gpt2 = std::make_shared<Regex>(kGpt2Regex, false, where);
        st.regex = gpt2;
      }
      t.pre.push_back(st);
    } else if (type == "Split") {
      check_keys(p, {"type", "pattern", "behavior", "invert"}, where, "the Split pre_tokenizer");
      if (!p.contains("pattern") || !p["pattern"].is_object())
        fail("tokenizer '", where, "': the Split pre_tokenizer has no \"pattern\" object");
      const json& pat = p["pattern"];
      if (pat.contains("Regex")) {
        st.regex = std::make_shared<Regex>(get_string(pat, "Regex", where), false, where);
      } else if (pat.contains("String")) {
        const std::string s = get_string(pat, "String", where);
        if (s.empty()) refuse(where, "a Split pre_tokenizer on the empty string");
        st.regex = std::make_shared<Regex>(s, true, where);
      } else {
        fail("tokenizer '", where, "': the Split pattern is neither {\"Regex\": ...} nor {\"String\": ...}");
      }
      const std::string b = p.contains("behavior") ? get_string(p, "behavior", where) : "Isolated";
      if (b == "Removed") st.behavior = Behavior::Removed;
      else if (b == "Isolated") st.behavior = Behavior::Isolated;
      else if (b == "MergedWithPrevious") st.behavior = Behavior::MergedWithPrevious;
      else if (b == "MergedWithNext") st.behavior = Behavior::MergedWithNext;
      else if (b == "Contiguous") st.behavior = Behavior::Contiguous;
      else fail("tokenizer '", where, "': unknown Split behavior '", b, "'");
      st.invert = get_bool(p, "invert", false, where);
      t.pre.push_back(st);
    } else if (type == "Sequence") {
      check_keys(p, {"type", "pretokenizers"}, where, "the Sequence pre_tokenizer");
      if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
        fail("tokenizer '", where, "': the Sequence pre_tokenizer has no \"pretokenizers\" array");
      for (const json& x : p["pretokenizers"]) pre(x);
    } else {
      refuse(where, "pre_tokenizer '" + type + "' (ByteLevel, Split and Sequence are)");
    }
  };
  if (j.contains("pre_tokenizer")) pre(j["pre_tokenizer"]);

  // post-processor: the single template's special tokens
  if (j.contains("post_processor")) parse_post_processor(j["post_processor"], where, t.prefix, t.suffix);

  // decoder: byte-level only
  if (!j.contains("decoder") || !byte_level_decoder(j["decoder"], where))
    refuse(where, "a tokenizer without a ByteLevel decoder");

  for (int32_t id : t.prefix)
    if (id < 0 || id >= t.vocab_size) fail("tokenizer '", where, "': template id ", id, " is out of range");
  for (int32_t id : t.suffix)
    if (id < 0 || id >= t.vocab_size) fail("tokenizer '", where, "': template id ", id, " is out of range");
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text) const {
  const Impl& t = *impl_;
  std::vector<int32_t> out;
  t.split_added(
      text, t.raw_added,
      [&](std::string_view piece) {
        const std::string normalized = t.nfc ? nfc(std::string(piece)) : std::string(piece);
        t.split_added(
            normalized, t.normalized_added, [&](std::string_view p) { t.encode_words(p, out); },
            [&](int32_t id) { out.push_back(id); });
      },
      [&](int32_t id) { out.push_back(id); });
  return out;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& t = *impl_;
  const ByteAlphabet& alpha = byte_alphabet();
  std::string bytes;
  for (int32_t id : ids) {
    const std::string* tok = nullptr;
    if (auto it = t.added_by_id.find(id); it != t.added_by_id.end()) tok = &t.added[it->second].content;
    else if (id >= 0 && size_t(id) < t.has_token.size() && t.has_token[size_t(id)]) tok = &t.id_to_token[size_t(id)];
    if (!tok) fail("token id ", id, " is not in the vocabulary of tokenizer '", t.where, "'");
    // ByteLevel decoder: each character back to its byte; a token with a character outside
    // the byte alphabet goes in as its own UTF-8 (the library's rule).
    std::string mapped;
    bool all = true;
    for (size_t i = 0; i < tok->size() && all;) {
      const int n = char_len(*tok, i);
      auto it = alpha.char_byte.find(decode_cp(*tok, i, n));
      if (it == alpha.char_byte.end()) all = false;
      else mapped += char(it->second);
      i += size_t(n);
    }
    bytes += all ? mapped : *tok;
  }
  return valid_utf8(bytes);
}

int HfTokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string HfTokenizer::id_to_token(int32_t id) const {
  const Impl& t = *impl_;
  if (auto it = t.added_by_id.find(id); it != t.added_by_id.end()) return t.added[it->second].content;
  if (id >= 0 && size_t(id) < t.has_token.size() && t.has_token[size_t(id)]) return t.id_to_token[size_t(id)];
  fail("token id ", id, " is not in the vocabulary of tokenizer '", t.where, "'");
}

const std::vector<int32_t>& HfTokenizer::template_prefix() const { return impl_->prefix; }
const std::vector<int32_t>& HfTokenizer::template_suffix() const { return impl_->suffix; }
int32_t HfTokenizer::unk_id() const { return impl_->unk; }

}  // namespace tetrad::data
