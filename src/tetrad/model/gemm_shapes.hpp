// The GEMM problems a model's training step runs, as shapes the backend's ceilings can time
// (backend/ceilings.hpp measures them; `tetrad bench` reports each against the square's).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "tetrad/backend/ceilings.hpp"
#include "tetrad/model/model_config.hpp"

namespace tetrad {

// The linear sites of a block and the head, in plan order: what a GEMM is for, as an enum (the
// model passes it; parallel/gemm_layouts.hpp keys each site's layouts by it). The names are only
// for I/O (a layout plan's text, printed plans, profile and communication labels).
enum class GemmSite : uint8_t { Qkv, Proj, Fc, FcProj, Head };
inline constexpr int kGemmSites = 5;
inline constexpr std::array<const char*, kGemmSites> kGemmSiteNames = {"qkv", "proj", "fc",
                                                                        "fcproj", "head"};
inline const char* gemm_site_name(GemmSite s) { return kGemmSiteNames[size_t(s)]; }

// The three products of a linear layer in a training step: forward, input gradient, weight
// gradient.
enum class GemmPass : uint8_t { Fwd, Dx, Dw };

// One GEMM of a step: its site, its pass and its shape (GemmShape::name: "attn.qkv.fwd", ...).
struct SiteGemm {
  GemmSite site;
  GemmPass pass;
  GemmShape shape;
};

// The GEMMs of one training step of a model over `tokens` tokens, each with its site and pass
// (the shapes of model_gemm_shapes, in the same order).
std::vector<SiteGemm> model_site_gemms(const ModelConfig& c, int tokens);

// The GEMMs of one training step of a model over `tokens` tokens, in tetrad's layout (linear
// weights stored [out, in], y = x·Wᵀ): for each linear layer its forward (NT), input-gradient
// (NN) and weight-gradient (TN) products, and the same for the output head. Attention's own
// batched products (scores, values) are not included.
std::vector<GemmShape> model_gemm_shapes(const ModelConfig& c, int tokens);

}  // namespace tetrad
