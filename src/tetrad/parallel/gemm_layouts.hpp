// The parallel model's GEMM layouts, per site (docs/precision.md, "GEMM layouts per site").
//
// Every GEMM of the model goes through one of five linear sites (qkv, proj, fc, fcproj, head),
// each with three products: the forward out = X·Wᵀ (NT: weights stored [out, in]), the input
// gradient dX = dY·W and the weight gradient dW += dYᵀ·X. With bf16 activations the gradient dY
// entering a site is cast to bf16 once, as stored (dY16 [N, out]) and/or transposed (dY16ᵀ
// [out, N]), so each backward product can read either copy without new memory:
//   dx  NN: dY16 · W            TN: (dY16ᵀ stored)ᵀ · W
//   dw  NN: (dY16ᵀ stored) · X   TN: (dY16 stored)ᵀ · X
// and any product may be computed as its transpose (GemmArgs::product = Transposed: Cᵀ into a
// scratch, added into C transposed). A site writes only the copies its products read.
//
// The plan is fixed ("rule": today's measured defaults, the same in every process) or "tune":
// each candidate timed on this rank's local shapes at model construction on random operands,
// interleaved over several rounds, medians; a candidate replaces the rule's form only when it is
// at least 5% faster; then rank 0's plan is broadcast over the world so a grid runs one plan
// (AxoNN's method). A plan is written into checkpoints and reused on resume (the same sums).
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "tetrad/model/gemm_shapes.hpp"

namespace tetrad::backend {
class Backend;
enum class Precision : uint8_t;
}  // namespace tetrad::backend

namespace tetrad::parallel {

enum class GemmLayouts { Rule, Tune };
GemmLayouts parse_gemm_layouts(const std::string& name);  // "rule" | "tune"; else Error
const char* gemm_layouts_name(GemmLayouts mode);

// One product's form: the call's first operand read transposed (ta; see the table above), and
// whether the product is computed as its transpose.
struct GemmForm {
  bool ta = false;
  bool transposed = false;
  bool operator==(const GemmForm&) const = default;
};
// "NT", "NT/tr" (forward); "NN", "TN", "NN/tr", "TN/tr" (dx, dw).
std::string gemm_form_name(bool forward, GemmForm f);

// The linear sites, in plan order (model/gemm_shapes.hpp, where the model's GEMM shapes carry
// them too). The model passes the enum; the names are only for I/O.
using ::tetrad::GemmSite;
using ::tetrad::gemm_site_name;
using ::tetrad::kGemmSiteNames;
using ::tetrad::kGemmSites;
int gemm_site_index(const std::string& name);  // -1 if not a site

struct GemmSiteLayout {
  int64_t N = 0, k_in = 0, n_out = 0;  // the local shape the forms were chosen for (0: any)
  GemmForm fwd, dx, dw;
  bool operator==(const GemmSiteLayout&) const = default;
};

struct GemmLayoutPlan {
  std::array<GemmSiteLayout, kGemmSites> site{};
  const GemmSiteLayout& at(GemmSite s) const { return site[size_t(s)]; }
  // "rule", "tuned", "checkpoint" or "given" (ParallelOptions::gemm_layout_plan).
  std::string source = "rule";
  // Explicit plans (tuned, checkpoint, given) pass their products' form to every GEMM
  // (GemmArgs::product); the rule leaves the kernel's own policy (TETRAD_GEMM_LAYOUT) in force.
  bool explicit_forms() const { return source != "rule"; }
  // "qkv:1024:768:2304:NT:TN:NN ..." (site:N:k_in:n_out:fwd:dx:dw, one token per site); what
  // checkpoints store and ParallelOptions::gemm_layout_plan takes (shape fields may be "*").
  std::string to_string() const;
  // Throws Error naming the bad token and the expected form.
  static GemmLayoutPlan parse(const std::string& text, const std::string& source);
  // Same forms on the same shapes ("*" shapes match any).
  bool same_shapes(const GemmLayoutPlan& other) const;
};

// What "auto" | "rule" | "tune" (train.gemm_layouts, tetrad bench --gemm-layouts) means for a
// model of this precision on this backend: Tune only for bf16 GEMMs that run natively on a
// backend that honours GemmArgs::product (the CPU with AMX-BF16 / AVX512-BF16); elsewhere Rule,
// with `why` saying so (also for an explicit "tune" that cannot apply). Other values: Error.
GemmLayouts resolve_gemm_layouts(const std::string& setting, backend::Precision precision,
                                 const backend::Backend& be, std::string* why);

}  // namespace tetrad::parallel
