#include "tetrad/model/gemm_shapes.hpp"

#include <string>

namespace tetrad {

std::vector<GemmShape> model_gemm_shapes(const ModelConfig& c, int tokens) {
  struct Linear {
    const char* name;
    int in, out;
  };
  const int C = c.n_embd;
  const int fc_out = c.mlp_in_dim();  // SwiGLU: gate+up fused
  const Linear linears[] = {{"attn.qkv", C, c.qkv_dim()},
                            {"attn.proj", C, C},
                            {"mlp.fc", C, fc_out},
                            {"mlp.proj", c.ffn, C},
                            {"lm_head", C, c.vocab_size}};
  std::vector<GemmShape> shapes;
  const int T = tokens;
  for (const Linear& l : linears) {
    std::string n = l.name;
    shapes.push_back({n + ".fwd", T, l.out, l.in, 'N', 'T'});  // y[T,out] = x[T,in]·W[out,in]ᵀ
    shapes.push_back({n + ".dx", T, l.in, l.out, 'N', 'N'});   // dx[T,in] = dy[T,out]·W
    shapes.push_back({n + ".dw", l.out, l.in, T, 'T', 'N'});   // dW[out,in] = dyᵀ·x
  }
  return shapes;
}

}  // namespace tetrad
