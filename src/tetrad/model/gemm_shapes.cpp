#include "tetrad/model/gemm_shapes.hpp"

#include <string>

namespace tetrad {

std::vector<SiteGemm> model_site_gemms(const ModelConfig& c, int tokens) {
  struct Linear {
    GemmSite site;
    const char* name;
    int in, out;
  };
  const int C = c.n_embd;
  const int fc_out = c.mlp_in_dim();  // SwiGLU: gate+up fused
  const Linear linears[] = {{GemmSite::Qkv, "attn.qkv", C, c.qkv_dim()},
                            {GemmSite::Proj, "attn.proj", c.q_dim(), C},
                            {GemmSite::Fc, "mlp.fc", C, fc_out},
                            {GemmSite::FcProj, "mlp.proj", c.ffn, C},
                            {GemmSite::Head, "lm_head", C, c.vocab_size}};
  std::vector<SiteGemm> gemms;
  const int T = tokens;
  for (const Linear& l : linears) {
    std::string n = l.name;
    // y[T,out] = x[T,in]·W[out,in]ᵀ; dx[T,in] = dy[T,out]·W; dW[out,in] = dyᵀ·x
    gemms.push_back({l.site, GemmPass::Fwd, {n + ".fwd", T, l.out, l.in, 'N', 'T'}});
    gemms.push_back({l.site, GemmPass::Dx, {n + ".dx", T, l.in, l.out, 'N', 'N'}});
    gemms.push_back({l.site, GemmPass::Dw, {n + ".dw", l.out, l.in, T, 'T', 'N'}});
  }
  return gemms;
}

std::vector<GemmShape> model_gemm_shapes(const ModelConfig& c, int tokens) {
  std::vector<GemmShape> shapes;
  for (SiteGemm& g : model_site_gemms(c, tokens)) shapes.push_back(std::move(g.shape));
  return shapes;
}

}  // namespace tetrad
