// The sizes one rank of a grid works with (4d-parallelism.md): the model's dimensions divided by
// the axes that split them. One value, computed once from (model, grid), that the model's parts,
// its activation layout and the memory formula all read instead of dividing by hand.
#pragma once
#include <algorithm>
#include <cstdint>

#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/grid.hpp"

namespace tetrad::parallel {

struct LocalDims {
  int64_t hd = 0;    // head dimension (not split)
  int64_t Cx = 0;    // hidden slice C / Gx: the hidden state's columns on this rank
  int64_t Ay = 0;    // attention output slice n_head hd / Gy (this rank's heads)
  int64_t nhy = 0;   // query heads of this rank: n_head / Gy
  int64_t nkvy = 0;  // key/value heads of this rank: n_kv_head / Gy
  int64_t QKVy = 0;  // q|k|v row of this rank's heads: (nhy + 2 nkvy) hd
  int64_t nqk = 0;   // heads normalised per row (q/k norm, Qwen3): nhy + nkvy, else 0
  int64_t QKn = 0;   // their width: nqk hd (the per-head norm's saved input)
  int64_t Fy = 0;    // MLP hidden slice ffn / Gy (the activation's output)
  int64_t FWy = 0;   // the MLP's first GEMM's output: Fy (GELU) or gate|up, 2 Fy (SwiGLU)
  int64_t Vy = 0;    // vocabulary slice V / Gy
  // A mixture of experts (0 for a dense model): the experts E, and per token its k expert rows'
  // widths on this rank: k Cx (inputs and outputs), k 2Fy (gate|up), k Fy (the SwiGLU
  // activation).
  int64_t E = 0, kC = 0, kFW = 0, kF = 0;
  int64_t sF = 0;  // the shared expert's width (model.shared_expert_ffn; 0: none)

  // The widest output of a linear layer (the bf16 gradient copies hold any of them), and in a
  // mixture of experts the k Cx of a token's expert rows (the experts' gradient copies).
  int64_t max_linear_out() const { return std::max({QKVy, FWy, Cx, Vy, kC}); }

  // The grid's divisibility is checked elsewhere (validate_grid_for_model).
  static LocalDims of(const ModelConfig& cfg, const GridShape& g) {
    LocalDims d;
    d.hd = cfg.head_dim();
    d.Cx = cfg.n_embd / g.x();
    d.nhy = cfg.n_head / g.y();
    d.Ay = d.nhy * d.hd;
    d.nkvy = cfg.n_kv_head / g.y();
    d.QKVy = (d.nhy + 2 * d.nkvy) * d.hd;
    d.nqk = cfg.desc().qk_norm ? d.nhy + d.nkvy : 0;
    d.QKn = d.nqk * d.hd;
    d.Fy = cfg.ffn / g.y();
    d.FWy = cfg.desc().mlp_in_factor() * d.Fy;
    d.Vy = cfg.vocab_size / g.y();
    if (cfg.moe()) {  // each expert split over X and Y like the dense MLP (Cx and Fy columns)
      const int64_t k = cfg.experts_per_token;
      d.E = cfg.n_experts;
      d.kC = k * d.Cx;
      d.kFW = k * 2 * d.Fy;
      d.kF = k * d.Fy;
      d.sF = cfg.shared_expert_ffn;  // whole: the grid refuses it on X or Y
    }
    return d;
  }
};

}  // namespace tetrad::parallel
