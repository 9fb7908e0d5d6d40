#include "tetrad/parallel/gemm_layouts.hpp"

#include <sstream>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

GemmLayouts parse_gemm_layouts(const std::string& name) {
  if (name == "rule") return GemmLayouts::Rule;
  if (name == "tune") return GemmLayouts::Tune;
  fail("gemm layouts: expected \"rule\" or \"tune\", got \"", name, "\"");
}

const char* gemm_layouts_name(GemmLayouts mode) {
  return mode == GemmLayouts::Tune ? "tune" : "rule";
}

std::string gemm_form_name(bool forward, GemmForm f) {
  std::string s = forward ? "NT" : (f.ta ? "TN" : "NN");
  if (f.transposed) s += "/tr";
  return s;
}

int gemm_site_index(const std::string& name) {
  for (int i = 0; i < kGemmSites; ++i)
    if (name == kGemmSiteNames[size_t(i)]) return i;
  return -1;
}

namespace {
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

GemmForm parse_form(const std::string& tok, bool forward, const std::string& where) {
  GemmForm f;
  std::string base = tok;
  if (base.size() > 3 && base.ends_with("/tr")) {
    f.transposed = true;
    base.resize(base.size() - 3);
  }
  if (forward) {
    if (base != "NT")
      fail("gemm layout plan: ", where, " = \"", tok,
           "\": the forward is \"NT\" or \"NT/tr\" (weights are stored [out, in])");
    return f;
  }
  if (base == "NN") f.ta = false;
  else if (base == "TN") f.ta = true;
  else
    fail("gemm layout plan: ", where, " = \"", tok,
         "\": expected \"NN\", \"TN\", \"NN/tr\" or \"TN/tr\"");
  return f;
}

int64_t parse_dim(const std::string& tok, const std::string& where) {
  if (tok == "*") return 0;
  try {
    size_t used = 0;
    const long long v = std::stoll(tok, &used);
    if (used == tok.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  fail("gemm layout plan: ", where, " = \"", tok, "\": expected a positive size or \"*\"");
}
}  // namespace

std::string GemmLayoutPlan::to_string() const {
  std::ostringstream o;
  for (int i = 0; i < kGemmSites; ++i) {
    const GemmSiteLayout& s = site[size_t(i)];
    auto dim = [](int64_t v) { return v > 0 ? std::to_string(v) : std::string("*"); };
    o << (i ? " " : "") << kGemmSiteNames[size_t(i)] << ":" << dim(s.N) << ":" << dim(s.k_in)
      << ":" << dim(s.n_out) << ":" << gemm_form_name(true, s.fwd) << ":"
      << gemm_form_name(false, s.dx) << ":" << gemm_form_name(false, s.dw);
  }
  return o.str();
}

GemmLayoutPlan GemmLayoutPlan::parse(const std::string& text, const std::string& source) {
  GemmLayoutPlan p;
  p.source = source;
  std::vector<bool> seen(kGemmSites, false);
  for (const std::string& tok : split(text, ' ')) {
    if (tok.empty()) continue;
    const std::vector<std::string> f = split(tok, ':');
    if (f.size() != 7)
      fail("gemm layout plan: \"", tok, "\": expected site:N:k_in:n_out:fwd:dx:dw, e.g. "
           "\"head:1024:768:50257:NT:TN:NN\" (sizes may be \"*\")");
    const int i = gemm_site_index(f[0]);
    if (i < 0)
      fail("gemm layout plan: unknown site \"", f[0], "\" (expected qkv, proj, fc, fcproj or head)");
    if (seen[size_t(i)]) fail("gemm layout plan: site \"", f[0], "\" given twice");
    seen[size_t(i)] = true;
    GemmSiteLayout& s = p.site[size_t(i)];
    s.N = parse_dim(f[1], f[0] + ".N");
    s.k_in = parse_dim(f[2], f[0] + ".k_in");
    s.n_out = parse_dim(f[3], f[0] + ".n_out");
    s.fwd = parse_form(f[4], true, f[0] + ".fwd");
    s.dx = parse_form(f[5], false, f[0] + ".dx");
    s.dw = parse_form(f[6], false, f[0] + ".dw");
  }
  for (int i = 0; i < kGemmSites; ++i)
    if (!seen[size_t(i)])
      fail("gemm layout plan \"", text, "\" lacks site \"", kGemmSiteNames[size_t(i)],
           "\" (every site needs its forms: site:N:k_in:n_out:fwd:dx:dw)");
  return p;
}

bool GemmLayoutPlan::same_shapes(const GemmLayoutPlan& o) const {
  auto eq = [](int64_t a, int64_t b) { return a == 0 || b == 0 || a == b; };
  for (int i = 0; i < kGemmSites; ++i) {
    const GemmSiteLayout &a = site[size_t(i)], &b = o.site[size_t(i)];
    if (!eq(a.N, b.N) || !eq(a.k_in, b.k_in) || !eq(a.n_out, b.n_out)) return false;
  }
  return true;
}

GemmLayouts resolve_gemm_layouts(const std::string& setting, backend::Precision precision,
                                 const backend::Backend& be, std::string* why) {
  if (setting != "auto" && setting != "rule" && setting != "tune")
    fail("gemm layouts = \"", setting, "\": expected \"auto\", \"rule\" or \"tune\"");
  auto say = [&](const std::string& s) {
    if (why) *why = s;
  };
  if (setting == "rule") {
    say("rule (as set)");
    return GemmLayouts::Rule;
  }
  const std::string asked = setting == "auto" ? "auto" : "tune";
  if (precision != backend::Precision::BF16) {
    say("rule (" + asked + ": fp32 GEMMs run sgemm, one layout)");
    return GemmLayouts::Rule;
  }
  const backend::Capabilities& caps = be.capabilities();
  if (!caps.gemm_product_forms) {
    say("rule (" + asked + ": backend '" + be.name() + "' chooses its own GEMM layouts)");
    return GemmLayouts::Rule;
  }
  // The CPU backend's capability is probed once; forced emulation (TETRAD_BF16=emulate,
  // set_bf16_emulation_forced) is read here (Backend::bf16_status).
  const backend::Bf16Status bf16 = be.bf16_status();
  if (!caps.gemm_bf16_native || !bf16.native) {
    const std::string& path = bf16.gemm_path;
    say("rule (" + asked + ": bf16 GEMMs are " +
        (path.starts_with("native") ? std::string("emulated (forced)") : path) +
        "; layouts matter only to the native matmul)");
    return GemmLayouts::Rule;
  }
  say(std::string("tune (") + (setting == "auto" ? "auto: " : "") + "bf16 GEMMs native)");
  return GemmLayouts::Tune;
}

}  // namespace tetrad::parallel
