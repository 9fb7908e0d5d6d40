#include "support/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/backend/cpu/attention.hpp"
#include "tetrad/backend/cpu/ops.hpp"
#include "tetrad/backend/cpu/precision.hpp"

namespace tetrad {

namespace k = kernels;

namespace {
// The bf16 kernels exist for float only; a double model never runs in bf16 (bf16_ is false), so
// these shims' double branches are unreachable.
constexpr const char* kNoBf16 = "bf16 mode is for Transformer<float> only";
template <typename T>
void ln_fwd16(uint16_t* o, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t n,
              int64_t C, T eps) {
  if constexpr (std::is_same_v<T, float>) k::layernorm_forward_bf16(o, mean, rstd, x, w, b, n, C, eps);
  else TETRAD_CHECK(false, kNoBf16);
}
template <typename T>
void rms_fwd16(uint16_t* o, T* rstd, const T* x, const T* w, int64_t n, int64_t C, T eps) {
  if constexpr (std::is_same_v<T, float>) k::rmsnorm_forward_bf16(o, rstd, x, w, n, C, eps);
  else TETRAD_CHECK(false, kNoBf16);
}
template <typename T>
void lin_fwd16(T* out, const uint16_t* in, const uint16_t* W, const T* bias, int64_t n,
               int64_t IC, int64_t OC, bool accumulate = false) {
  if constexpr (std::is_same_v<T, float>) k::linear_forward_bf16(out, in, W, bias, n, IC, OC, accumulate);
  else TETRAD_CHECK(false, kNoBf16);
}
template <typename T>
void lin_bwd16(T* din, T* dW, T* dbias, const uint16_t* dout, const T* dout32, const uint16_t* in,
               const uint16_t* W, int64_t n, int64_t IC, int64_t OC) {
  if constexpr (std::is_same_v<T, float>) k::linear_backward_bf16(din, dW, dbias, dout, dout32, in, W, n, IC, OC);
  else TETRAD_CHECK(false, kNoBf16);
}
template <typename T>
void to16(const T* x, uint16_t* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>) k::convert_to_bf16(x, y, n);
  else TETRAD_CHECK(false, kNoBf16);
}
template <typename T>
void gemm16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
            const uint16_t* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>)
    k::gemm_bf16(ta, tb, M, N, K, 1.0f, k::Bf16Operand::bf16_stored(A, lda),
                 k::Bf16Operand::bf16_stored(B, ldb), beta, C, ldc);
  else TETRAD_CHECK(false, kNoBf16);
}
// Per-head RMSNorm (Qwen3's q_norm / k_norm), written here independently of the backend's op:
// each of the H heads of every row (stride) normalised over its hd elements, times w; the
// input kept in saved (N, H hd) and the statistics in rstd (N, H).
template <typename T>
void head_norm_forward(T* x, T* saved, T* rstd, const T* w, int64_t N, int64_t H, int64_t hd,
                       int64_t stride, T eps) {
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < H; ++h) {
      T* v = x + r * stride + h * hd;
      double ss = 0;
      for (int64_t d = 0; d < hd; ++d) ss += double(v[d]) * double(v[d]);
      const T rs = T(1.0 / std::sqrt(ss / double(hd) + double(eps)));
      rstd[r * H + h] = rs;
      for (int64_t d = 0; d < hd; ++d) {
        saved[(r * H + h) * hd + d] = v[d];
        v[d] = v[d] * rs * w[d];
      }
    }
}
// In place: g (the heads' dy) becomes dx; dw += Σ dy x̂.
template <typename T>
void head_norm_backward(T* g, T* dw, const T* saved, const T* rstd, const T* w, int64_t N,
                        int64_t H, int64_t hd, int64_t stride) {
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < H; ++h) {
      T* dy = g + r * stride + h * hd;
      const T* s = saved + (r * H + h) * hd;
      const T rs = rstd[r * H + h];
      double dot = 0;
      for (int64_t d = 0; d < hd; ++d) {
        dot += double(dy[d]) * double(w[d]) * double(s[d] * rs);
        dw[d] += dy[d] * (s[d] * rs);
      }
      const T m = T(dot / double(hd));
      for (int64_t d = 0; d < hd; ++d) dy[d] = (dy[d] * w[d] - s[d] * rs * m) * rs;
    }
}
}  // namespace

// Offsets of one block's tensors in the parameter (and gradient) buffer, bound by role; -1 =
// absent. A fused group (kFusedGroups: q|k|v, gate|up) is one matrix at its first tensor.
template <typename T>
struct Transformer<T>::Layer {
  int64_t ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
  int64_t ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, fcproj_w = -1, fcproj_b = -1;
  int64_t q_norm = -1, k_norm = -1;
  int64_t router = -1, gate_up = -1, down = -1;  // a mixture of experts' (model/family.hpp)
  int64_t shared_gu = -1, shared_down = -1, shared_gate = -1, expert_bias = -1;  // optional
};

// What a mixture-of-experts layer keeps from its forward for its backward: the router's softmax
// and log-sum-exp, each token's k choices (most probable first), their combine weights and
// whether the expert took them (capacity), and each kept choice's expert activations.
template <typename T>
struct Transformer<T>::MoeLayer {
  std::vector<T> probs, lse;    // [N, E], [N]
  std::vector<int32_t> choice;  // [N, k]
  std::vector<T> weight;        // [N, k]
  std::vector<char> kept;       // [N, k]
  std::vector<int64_t> routed;  // [E] choices per expert before any drop
  std::vector<T> h, act, out;   // [N, k, 2F] gate|up, [N, k, F] SwiGLU, [N, k, C] expert output
  std::vector<T> sh, sact, sout, sgate;  // the shared expert: [N, 2Fs], [N, Fs], [N, C], [N] sigmoid
};

// Views into the activation buffer. N = max_batch * max_len tokens, C hidden, QKV = (nh+2nkv)hd,
// QH = nh hd (the attention output, heads concatenated), FW = width of the MLP input GEMM (F for
// GELU, 2F for SwiGLU's gate+up), F = MLP inner.
template <typename T>
struct Transformer<T>::Acts {
  struct PerLayer {
    T* ln1;        // (N, C)   normalised block input
    T* ln1_mean;   // (N)      LayerNorm only
    T* ln1_rstd;   // (N)
    T* qkv;        // (N, QKV) q | k | v of every head (after rotary positions)
    T* qk_in;      // (N, QKn) q/k norm (Qwen3): q heads' inputs (N, nh hd), then k heads'
    T* qk_rstd;    // (N, nqk) their statistics: q heads' (N, nh), then k heads'
    T* atty;       // (N, QH)  attention output, heads concatenated
    T* lse;        // (B, nh, T) log-sum-exp of each attention row
    T* resid_mid;  // (N, C)   x + attention
    T* ln2;        // (N, C)
    T* ln2_mean;   // (N)
    T* ln2_rstd;   // (N)
    T* fc;         // (N, FW)  MLP input GEMM, before the activation
    T* fc_act;     // (N, F)
    T* resid_out;  // (N, C)   block output
    // bf16 mode: ln1, ln2 and fc_act are stored only in bf16 (they feed GEMMs only); the
    // attention output is kept in fp32 (its backward reads it) with a bf16 copy for the GEMMs.
    uint16_t *ln1_16 = nullptr, *atty16 = nullptr, *ln2_16 = nullptr, *fc_act16 = nullptr;
  };
  std::vector<PerLayer> layer;
  T* emb;        // (N, C)
  T* lnf;        // (N, C)
  T* lnf_mean;   // (N)
  T* lnf_rstd;   // (N)
  T* logits;     // (N, V)   overwritten with dlogits by the fused cross-entropy
  T* losses;     // (N)
  // backward scratch, reused by every layer
  T* dresid;     // (N, C)   gradient of the residual stream
  T* dln;        // (N, C)
  T* dqkv;       // (N, QKV)
  T* datty;      // (N, QH)
  T* dfc;        // (N, FW)
  T* dfc_act;    // (N, F)
  // bf16 mode
  uint16_t* lnf16 = nullptr;      // (N, C)  replaces lnf
  uint16_t* dlogits16 = nullptr;  // (N, V)  the loss gradient the head's GEMMs read
  uint16_t* dresid16 = nullptr;   // (N, C)  dresid entering the projections' GEMMs
  uint16_t* dfc16 = nullptr;      // (N, FW) replaces dfc
  uint16_t* dqkv16 = nullptr;     // (N, QKV)
};

template <typename T>
struct Transformer<T>::Cache {
  int B = 0;
  int pos = 0;
  Buffer<T> k, v;  // (L, B, max_len, nkv*hd) each
};

template <typename T>
Transformer<T>::Transformer(const ModelConfig& config, int max_batch, int max_len,
                            backend::Precision precision)
    : cfg_(config), fam_(config.desc()), max_batch_(max_batch), max_len_(max_len) {
  if (precision == backend::Precision::BF16 && !std::is_same_v<T, float>) fail(kNoBf16);
  cfg_.validate();
  if (max_batch <= 0) fail("micro-batch size must be positive, got ", max_batch);
  if (max_len <= 0 || max_len > cfg_.max_seq)
    fail("sequence length ", max_len, " is outside what the model supports (1..",
         cfg_.max_seq, " = model.max_seq)");
  if (fam_.moe && precision == backend::Precision::BF16)
    fail("the test oracle's mixture of experts is fp32 / double only");
  if (fam_.moe) moe_.resize(size_t(cfg_.n_layer));
  table_ = build_param_table(cfg_);
  params_ = Buffer<T>(table_.total);
  grads_ = Buffer<T>(table_.total);
  bind_tensors();

  // Activations: one allocation per element type, carved into views. In bf16 mode the tensors
  // that only feed GEMMs are bf16 (see Acts); the fp32 ones they replace are not allocated.
  bf16_ = precision == backend::Precision::BF16;
  const int64_t N = int64_t(max_batch) * max_len, C = cfg_.n_embd, V = cfg_.vocab_size;
  const int64_t QKV = cfg_.qkv_dim(), QH = cfg_.q_dim(), F = cfg_.ffn, FW = cfg_.mlp_in_dim();
  const int64_t h = bf16_ ? 0 : 1;  // 1 where an fp32 tensor exists only in fp32 mode
  const int64_t nqk = fam_.qk_norm ? cfg_.n_head + cfg_.n_kv_head : 0, QKn = nqk * cfg_.head_dim();
  const int64_t per_layer =
      N * (h * C + 1 + 1 + QKV + QKn + nqk + QH + cfg_.n_head + C + h * C + 1 + 1 + FW + h * F + C);
  const int64_t global = N * (C + h * C + 1 + 1 + V + 1) + N * (C + C + QKV + QH + h * FW + F);
  acts_ = Buffer<T>(per_layer * cfg_.n_layer + global);
  const int64_t per_layer16 = N * (C + QH + C + F);
  const int64_t global16 = N * (C + V + C + FW + QKV);
  if (bf16_) acts16_ = Buffer<uint16_t>(per_layer16 * cfg_.n_layer + global16);
  a_ = std::make_unique<Acts>();
  T* cur = acts_.data();
  uint16_t* cur16 = acts16_.data();
  auto take = [&](int64_t n) { T* p = cur; cur += n; return p; };
  auto take32 = [&](int64_t n) -> T* { return bf16_ ? nullptr : take(n); };  // fp32 mode only
  auto take16 = [&](int64_t n) -> uint16_t* {
    if (!bf16_) return nullptr;
    uint16_t* p = cur16;
    cur16 += n;
    return p;
  };
  a_->layer.resize(cfg_.n_layer);
  for (auto& A : a_->layer) {
    A.ln1 = take32(N * C); A.ln1_mean = take(N); A.ln1_rstd = take(N);
    A.qkv = take(N * QKV); A.qk_in = take(N * QKn); A.qk_rstd = take(N * nqk); A.atty = take(N * QH); A.lse = take(N * cfg_.n_head);
    A.resid_mid = take(N * C); A.ln2 = take32(N * C); A.ln2_mean = take(N); A.ln2_rstd = take(N);
    A.fc = take(N * FW); A.fc_act = take32(N * F); A.resid_out = take(N * C);
    A.ln1_16 = take16(N * C); A.atty16 = take16(N * QH); A.ln2_16 = take16(N * C);
    A.fc_act16 = take16(N * F);
  }
  a_->emb = take(N * C); a_->lnf = take32(N * C); a_->lnf_mean = take(N); a_->lnf_rstd = take(N);
  a_->logits = take(N * V); a_->losses = take(N);
  a_->dresid = take(N * C); a_->dln = take(N * C); a_->dqkv = take(N * QKV);
  a_->datty = take(N * QH); a_->dfc = take32(N * FW); a_->dfc_act = take(N * F);
  a_->lnf16 = take16(N * C); a_->dlogits16 = take16(N * V); a_->dresid16 = take16(N * C);
  a_->dfc16 = take16(N * FW); a_->dqkv16 = take16(N * QKV);
  TETRAD_CHECK(cur == acts_.data() + acts_.size());
  TETRAD_CHECK(cur16 == acts16_.data() + acts16_.size());
  if (bf16_) params16_ = Buffer<uint16_t>(table_.total);

  if (fam_.positions == Positions::Rope) {
    const int64_t half = cfg_.head_dim() / 2;
    rope_cos_ = Buffer<T>(size_t(cfg_.max_seq) * half);
    rope_sin_ = Buffer<T>(size_t(cfg_.max_seq) * half);
    k::rope_tables(rope_cos_.data(), rope_sin_.data(), cfg_.max_seq, cfg_.head_dim(),
                   rope_frequencies(cfg_));
  }
}

// Each tensor's place in the model, by its role (the family's table, model/family.hpp). A role
// the oracle has no place for is refused, so a family with new tensors needs its part here.
template <typename T>
void Transformer<T>::bind_tensors() {
  using R = TensorRole;
  layers_.assign(size_t(cfg_.n_layer), Layer{});
  for (const ParamSpec& s : table_.specs) {
    const int64_t o = s.offset;
    if (s.layer < 0) {
      switch (s.role) {
        case R::TokenEmbedding: wte_ = o; break;
        case R::PositionEmbedding: wpe_ = o; break;
        case R::FinalNorm: lnf_w_ = o; break;
        case R::FinalNormBias: lnf_b_ = o; break;
        case R::Head: head_ = o; break;
        default: fail("the test oracle has no place for '", s.name, "' (", role_name(s.role), ") outside the blocks");
      }
      continue;
    }
    Layer& L = layers_[size_t(s.layer)];
    switch (s.role) {
      case R::AttnNorm: L.ln1_w = o; break;
      case R::AttnNormBias: L.ln1_b = o; break;
      case R::Qkv: case R::Q: L.qkv_w = o; break;  // Q: k and v follow it (kFusedQkv)
      case R::K: case R::V: break;
      case R::QkvBias: case R::QBias: L.qkv_b = o; break;  // QBias: k's, v's follow (kFusedQkvBias)
      case R::KBias: case R::VBias: break;
      case R::AttnOut: L.proj_w = o; break;
      case R::AttnOutBias: L.proj_b = o; break;
      case R::MlpNorm: L.ln2_w = o; break;
      case R::MlpNormBias: L.ln2_b = o; break;
      case R::MlpIn: case R::Gate: L.fc_w = o; break;  // Gate: up follows it (kFusedGateUp)
      case R::Up: break;
      case R::MlpInBias: L.fc_b = o; break;
      case R::MlpOut: L.fcproj_w = o; break;
      case R::MlpOutBias: L.fcproj_b = o; break;
      case R::QNorm: L.q_norm = o; break;
      case R::KNorm: L.k_norm = o; break;
      case R::Router: L.router = o; break;
      case R::ExpertGateUp: L.gate_up = o; break;
      case R::ExpertDown: L.down = o; break;
      case R::SharedGate: L.shared_gu = o; break;  // SharedUp follows it (kFusedSharedGateUp)
      case R::SharedUp: break;
      case R::SharedDown: L.shared_down = o; break;
      case R::SharedExpertGate: L.shared_gate = o; break;
      case R::ExpertBias: L.expert_bias = o; break;
      default: fail("the test oracle has no place for '", s.name, "' (", role_name(s.role), ") inside a block");
    }
  }
  if (cfg_.tie_embeddings) head_ = wte_;  // the output head is the token embedding
}

template <typename T>
Transformer<T>::~Transformer() = default;

template <typename T>
void Transformer<T>::refresh_params_bf16() {
  if (!bf16_ || params16_current_) return;
  timed(Phase::Optimizer, [&] { to16(params_.data(), params16_.data(), table_.total); });
  params16_current_ = true;
}

template <typename T>
void Transformer<T>::init_weights(uint64_t seed) {
  params16_current_ = false;
  for (size_t i = 0; i < table_.specs.size(); ++i)
    init_parameter(cfg_, table_.specs[i], i, seed, params_.data() + table_.specs[i].offset);
}

// The family's norm (LayerNorm: mean, rstd, weight, bias; RMSNorm: rstd, weight) over N rows of
// x: into out, or in bf16 mode into out16 only.
template <typename T>
void Transformer<T>::norm_forward(T* out, uint16_t* out16, T* mean, T* rstd, const T* x,
                                  int64_t w, int64_t b, int64_t N) {
  const int64_t C = cfg_.n_embd;
  const T eps = T(cfg_.norm_eps);
  const T* P = params_.data();
  const T* pb = b < 0 ? nullptr : P + b;
  timed(Phase::Norm, [&] {
    switch (fam_.norm) {
      case NormKind::LayerNorm:
        if (bf16_) ln_fwd16(out16, mean, rstd, x, P + w, pb, N, C, eps);
        else k::layernorm_forward(out, mean, rstd, x, P + w, pb, N, C, eps);
        break;
      case NormKind::RMSNorm:
        if (bf16_) rms_fwd16(out16, rstd, x, P + w, N, C, eps);
        else k::rmsnorm_forward(out, rstd, x, P + w, N, C, eps);
        break;
    }
  });
}

// dx += the norm's input gradient; its weight's (and bias') gradients accumulate.
template <typename T>
void Transformer<T>::norm_backward(T* dx, const T* dout, const T* x, int64_t w, int64_t b,
                                   const T* mean, const T* rstd, int64_t N) {
  const int64_t C = cfg_.n_embd;
  const T* P = params_.data();
  T* G = grads_.data();
  timed(Phase::Norm, [&] {
    switch (fam_.norm) {
      case NormKind::LayerNorm:
        k::layernorm_backward(dx, G + w, b < 0 ? nullptr : G + b, dout, x, P + w, mean, rstd, N, C);
        break;
      case NormKind::RMSNorm: k::rmsnorm_backward(dx, G + w, dout, x, P + w, rstd, N, C); break;
    }
  });
}

// out = in · Wᵀ + bias (added to out when accumulate), W at offset w: fp32, or in bf16 mode from
// in16 and the bf16 weight copy.
template <typename T>
void Transformer<T>::linear_forward(T* out, const T* in, const uint16_t* in16, int64_t w,
                                    int64_t b, int64_t N, int64_t IC, int64_t OC, bool accumulate) {
  const T* pb = b < 0 ? nullptr : params_.data() + b;
  timed(Phase::Gemm, [&] {
    if (bf16_) lin_fwd16(out, in16, params16_.data() + w, pb, N, IC, OC, accumulate);
    else k::linear_forward(out, in, params_.data() + w, pb, N, IC, OC, accumulate);
  });
}

// din = dout · W; W's (and the bias') gradients accumulate. bf16 mode reads dout16, in16 and the
// bf16 weights; dout then only feeds the bias gradient (nullptr: from dout16).
template <typename T>
void Transformer<T>::linear_backward(T* din, const T* dout, const uint16_t* dout16, const T* in,
                                     const uint16_t* in16, int64_t w, int64_t b, int64_t N,
                                     int64_t IC, int64_t OC) {
  T* G = grads_.data();
  T* gb = b < 0 ? nullptr : G + b;
  timed(Phase::Gemm, [&] {
    if (bf16_) lin_bwd16(din, G + w, gb, dout16, dout, in16, params16_.data() + w, N, IC, OC);
    else k::linear_backward(din, G + w, gb, dout, in, params_.data() + w, N, IC, OC);
  });
}

// The MLP's activation by the family's kind: GELU of N*F values, or SwiGLU of the N rows of
// [gate | up] (2F wide) into F.
template <typename T>
void Transformer<T>::mlp_activation(T* act, uint16_t* act16, const T* fc, int64_t N) {
  const int64_t F = cfg_.ffn;
  timed(Phase::Activation, [&] {
    if (bf16_) {
      if constexpr (std::is_same_v<T, float>) {
        switch (fam_.mlp) {
          case MlpKind::Gelu: k::gelu_forward_bf16(act16, fc, N * F); break;
          case MlpKind::SwiGLU: k::swiglu_forward_bf16(act16, fc, N, F); break;
        }
      }
      return;
    }
    switch (fam_.mlp) {
      case MlpKind::Gelu: k::gelu_forward(act, fc, N * F); break;
      case MlpKind::SwiGLU: k::swiglu_forward(act, fc, N, F); break;
    }
  });
}

template <typename T>
void Transformer<T>::mlp_activation_backward(T* dfc, uint16_t* dfc16, const T* dact, const T* fc,
                                             int64_t N) {
  const int64_t F = cfg_.ffn;
  timed(Phase::Activation, [&] {
    if (bf16_) {
      if constexpr (std::is_same_v<T, float>) {
        switch (fam_.mlp) {
          case MlpKind::Gelu: k::gelu_backward_bf16(dfc16, dact, fc, N * F); break;
          case MlpKind::SwiGLU: k::swiglu_backward_bf16(dfc16, dact, fc, N, F); break;
        }
      }
      return;
    }
    switch (fam_.mlp) {
      case MlpKind::Gelu: k::gelu_backward(dfc, dact, fc, N * F); break;
      case MlpKind::SwiGLU: k::swiglu_backward(dfc, dact, fc, N, F); break;
    }
  });
}

template <typename T>
void Transformer<T>::forward(const int32_t* inputs, int B, int Tq, int pos0, bool use_cache) {
  if (B <= 0 || B > max_batch_)
    fail("micro-batch of ", B, " sequences; this model was set up for 1..", max_batch_);
  if (Tq <= 0 || pos0 + Tq > max_len_)
    fail("sequence of ", pos0 + Tq, " tokens is longer than the model's maximum of ", max_len_,
         " (model.max_seq / train.seq_len)");
  const bool rope = fam_.positions == Positions::Rope;
  const int64_t N = int64_t(B) * Tq, C = cfg_.n_embd, V = cfg_.vocab_size;
  const int64_t nh = cfg_.n_head, nkv = cfg_.n_kv_head, hd = cfg_.head_dim();
  const int64_t QKV = cfg_.qkv_dim(), QH = cfg_.q_dim(), F = cfg_.ffn, FW = cfg_.mlp_in_dim();
  refresh_params_bf16();
  const T* P = params_.data();
  Acts& a = *a_;

  const T* wpe = wpe_ < 0 ? nullptr : P + wpe_ + int64_t(pos0) * C;  // learned positions
  timed(Phase::Embedding, [&] { k::embedding_forward(a.emb, inputs, P + wte_, wpe, N, Tq, C, V); });

  const T* x = a.emb;
  router_loss_ = 0;
  mean_aux_ = 0;
  expert_rows_.assign(size_t(cfg_.n_experts), 0);
  expert_load_.assign(size_t(cfg_.n_layer) * size_t(cfg_.n_experts), 0);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const Layer& L = layers_[l];
    auto& A = a.layer[l];
    norm_forward(A.ln1, A.ln1_16, A.ln1_mean, A.ln1_rstd, x, L.ln1_w, L.ln1_b, N);
    linear_forward(A.qkv, A.ln1, A.ln1_16, L.qkv_w, L.qkv_b, N, C, QKV);
    if (fam_.qk_norm)
      timed(Phase::Norm, [&] {
        head_norm_forward(A.qkv, A.qk_in, A.qk_rstd, P + L.q_norm, N, nh, hd, QKV, T(cfg_.norm_eps));
        head_norm_forward(A.qkv + nh * hd, A.qk_in + N * nh * hd, A.qk_rstd + N * nh, P + L.k_norm,
                          N, nkv, hd, QKV, T(cfg_.norm_eps));
      });
    if (rope)
      timed(Phase::Attention, [&] { k::rope_forward(A.qkv, N, Tq, pos0, nh + nkv, hd, QKV, rope_cos_.data(), rope_sin_.data()); });

    k::AttentionDims d{};
    d.B = B; d.Tq = Tq; d.n_head = int(nh); d.n_kv_head = int(nkv); d.head_dim = int(hd);
    d.q_stride = QKV; d.q_batch_stride = Tq * QKV;
    d.out_stride = QH; d.out_batch_stride = Tq * QH;
    const T* q = A.qkv;
    const T *kp = A.qkv + nh * hd, *vp = A.qkv + (nh + nkv) * hd;
    if (use_cache) {
      // Append this step's keys and values, then attend over everything cached so far.
      const int64_t KW = nkv * hd;
      T* kc = cache_->k.data() + int64_t(l) * cache_->B * max_len_ * KW;
      T* vc = cache_->v.data() + int64_t(l) * cache_->B * max_len_ * KW;
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < Tq; ++i) {
          const T* row = A.qkv + (int64_t(b) * Tq + i) * QKV;
          const int64_t dst = (int64_t(b) * max_len_ + pos0 + i) * KW;
          std::memcpy(kc + dst, row + nh * hd, KW * sizeof(T));
          std::memcpy(vc + dst, row + (nh + nkv) * hd, KW * sizeof(T));
        }
      kp = kc; vp = vc;
      d.Tk = pos0 + Tq; d.kv_stride = KW; d.kv_batch_stride = int64_t(max_len_) * KW;
      timed(Phase::Attention, [&] { k::attention_forward<T>(A.atty, nullptr, q, kp, vp, d); });
    } else {
      d.Tk = Tq; d.kv_stride = QKV; d.kv_batch_stride = Tq * QKV;
      timed(Phase::Attention, [&] { k::attention_forward<T>(A.atty, A.lse, q, kp, vp, d); });
    }

    timed(Phase::Residual, [&] { std::memcpy(A.resid_mid, x, N * C * sizeof(T)); });
    if (bf16_) timed(Phase::Attention, [&] { to16(A.atty, A.atty16, N * QH); });
    linear_forward(A.resid_mid, A.atty, A.atty16, L.proj_w, L.proj_b, N, QH, C, /*accumulate=*/true);
    norm_forward(A.ln2, A.ln2_16, A.ln2_mean, A.ln2_rstd, A.resid_mid, L.ln2_w, L.ln2_b, N);
    if (fam_.moe) {
      moe_forward(l, N);
      x = A.resid_out;
      continue;
    }
    linear_forward(A.fc, A.ln2, A.ln2_16, L.fc_w, L.fc_b, N, C, FW);
    mlp_activation(A.fc_act, A.fc_act16, A.fc, N);
    timed(Phase::Residual, [&] { std::memcpy(A.resid_out, A.resid_mid, N * C * sizeof(T)); });
    linear_forward(A.resid_out, A.fc_act, A.fc_act16, L.fcproj_w, L.fcproj_b, N, F, C, /*accumulate=*/true);
    x = A.resid_out;
  }
  norm_forward(a.lnf, a.lnf16, a.lnf_mean, a.lnf_rstd, x, lnf_w_, lnf_b_, N);
}

// Logits [rows, V] of the final norm's rows (row i at lnf + i * stride) through the output head.
template <typename T>
void Transformer<T>::head_logits(int64_t rows, int64_t first, int64_t stride) {
  const int64_t C = cfg_.n_embd, V = cfg_.vocab_size;
  if (bf16_)
    timed(Phase::Gemm, [&] { gemm16(false, true, rows, V, C, a_->lnf16 + first, stride, params16_.data() + head_, C, T(0), a_->logits, V); });
  else
    timed(Phase::Gemm, [&] { k::gemm<T>(false, true, rows, V, C, T(1), a_->lnf + first, stride, params_.data() + head_, C, T(0),
               a_->logits, V); });
}

template <typename T>
const T* Transformer<T>::forward_logits(const int32_t* inputs, int B, int Tq) {
  forward(inputs, B, Tq, 0, false);
  head_logits(int64_t(B) * Tq, 0, cfg_.n_embd);
  return a_->logits;
}

template <typename T>
const T* Transformer<T>::logits() const { return a_->logits; }

template <typename T>
double Transformer<T>::forward_loss(const int32_t* inputs, const int32_t* targets, int B, int Tq) {
  forward_logits(inputs, B, Tq);
  ScopedPhase sp(prof_, Phase::Loss);
  return k::cross_entropy_forward(a_->losses, a_->logits, targets, int64_t(B) * Tq,
                                  int64_t(cfg_.vocab_size));
}

template <typename T>
double Transformer<T>::forward_backward(const int32_t* inputs, const int32_t* targets, int B,
                                        int Tq, T grad_scale) {
  forward_logits(inputs, B, Tq);
  double loss_sum = 0;
  timed(Phase::Loss, [&] {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_) {
        loss_sum = k::cross_entropy_fused_bf16(a_->logits, a_->dlogits16, a_->losses, targets,
                                               int64_t(B) * Tq, int64_t(cfg_.vocab_size), grad_scale);
        return;
      }
    }
    loss_sum = k::cross_entropy_fused(a_->logits, a_->losses, targets, int64_t(B) * Tq,
                                      int64_t(cfg_.vocab_size), grad_scale);
  });
  grad_scale_ = grad_scale;
  backward(inputs, B, Tq);
  return loss_sum;
}

template <typename T>
void Transformer<T>::backward(const int32_t* inputs, int B, int Tq) {
  const bool rope = fam_.positions == Positions::Rope;
  const int64_t N = int64_t(B) * Tq, C = cfg_.n_embd, V = cfg_.vocab_size;
  const int64_t nh = cfg_.n_head, nkv = cfg_.n_kv_head, hd = cfg_.head_dim();
  const int64_t QKV = cfg_.qkv_dim(), QH = cfg_.q_dim(), F = cfg_.ffn, FW = cfg_.mlp_in_dim();
  T* G = grads_.data();
  const T* P = params_.data();
  Acts& a = *a_;
  const T* x_last = cfg_.n_layer > 0 ? a.layer.back().resid_out : a.emb;
  // In bf16 mode the GEMMs read dresid in bf16.
  auto dresid16 = [&] {
    if (bf16_) timed(Phase::Norm, [&] { to16(a.dresid, a.dresid16, N * C); });
  };

  // Output head (dlogits already in a.logits; bf16: a.dlogits16) and the final norm.
  linear_backward(a.dln, a.logits, a.dlogits16, a.lnf, a.lnf16, head_, -1, N, C, V);
  timed(Phase::Residual, [&] { std::fill(a.dresid, a.dresid + N * C, T(0)); });
  norm_backward(a.dresid, a.dln, x_last, lnf_w_, lnf_b_, a.lnf_mean, a.lnf_rstd, N);

  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const Layer& L = layers_[l];
    auto& A = a.layer[l];
    const T* x_in = l == 0 ? a.emb : a.layer[l - 1].resid_out;

    // resid_out = resid_mid + fcproj(act(fc(norm2(resid_mid))))
    if (fam_.moe) {
      moe_backward(l, N);
    } else {
      dresid16();
      linear_backward(a.dfc_act, a.dresid, a.dresid16, A.fc_act, A.fc_act16, L.fcproj_w, L.fcproj_b, N, F, C);
      mlp_activation_backward(a.dfc, a.dfc16, a.dfc_act, A.fc, N);
      linear_backward(a.dln, a.dfc, a.dfc16, A.ln2, A.ln2_16, L.fc_w, L.fc_b, N, C, FW);
    }
    norm_backward(a.dresid, a.dln, A.resid_mid, L.ln2_w, L.ln2_b, A.ln2_mean, A.ln2_rstd, N);

    // resid_mid = x_in + proj(attention(rope(qkv(norm1(x_in)))))
    dresid16();
    linear_backward(a.datty, a.dresid, a.dresid16, A.atty, A.atty16, L.proj_w, L.proj_b, N, QH, C);
    k::AttentionDims d{};
    d.B = B; d.Tq = Tq; d.Tk = Tq; d.n_head = int(nh); d.n_kv_head = int(nkv); d.head_dim = int(hd);
    d.q_stride = d.kv_stride = QKV; d.q_batch_stride = d.kv_batch_stride = Tq * QKV;
    d.out_stride = QH; d.out_batch_stride = Tq * QH;
    timed(Phase::Attention, [&] { k::attention_backward<T>(a.dqkv, a.dqkv + nh * hd, a.dqkv + (nh + nkv) * hd, a.datty, A.qkv,
                             A.qkv + nh * hd, A.qkv + (nh + nkv) * hd, A.atty, A.lse, d); });
    if (rope)
      timed(Phase::Attention, [&] { k::rope_backward(a.dqkv, N, Tq, 0, nh + nkv, hd, QKV, rope_cos_.data(), rope_sin_.data()); });
    if (fam_.qk_norm)
      timed(Phase::Norm, [&] {
        head_norm_backward(a.dqkv, G + L.q_norm, A.qk_in, A.qk_rstd, P + L.q_norm, N, nh, hd, QKV);
        head_norm_backward(a.dqkv + nh * hd, G + L.k_norm, A.qk_in + N * nh * hd, A.qk_rstd + N * nh,
                           P + L.k_norm, N, nkv, hd, QKV);
      });
    if (bf16_) timed(Phase::Attention, [&] { to16(a.dqkv, a.dqkv16, N * QKV); });
    linear_backward(a.dln, a.dqkv, a.dqkv16, A.ln1, A.ln1_16, L.qkv_w, L.qkv_b, N, C, QKV);
    norm_backward(a.dresid, a.dln, x_in, L.ln1_w, L.ln1_b, A.ln1_mean, A.ln1_rstd, N);
  }

  T* dwpe = wpe_ < 0 ? nullptr : G + wpe_;
  timed(Phase::Embedding, [&] { k::embedding_backward(G + wte_, dwpe, a.dresid, inputs, N, Tq, C); });
}

template <typename T>
void Transformer<T>::start_cache(int B) {
  if (B <= 0 || B > max_batch_)
    fail("generation batch of ", B, " sequences; this model was set up for 1..", max_batch_);
  if (!cache_ || cache_->B != B) {
    cache_ = std::make_unique<Cache>();
    cache_->B = B;
    const size_t n = size_t(cfg_.n_layer) * B * max_len_ * cfg_.kv_dim();
    cache_->k = Buffer<T>(n);
    cache_->v = Buffer<T>(n);
  }
  cache_->pos = 0;
}

template <typename T>
int Transformer<T>::cache_position() const { return cache_ ? cache_->pos : 0; }

template <typename T>
const T* Transformer<T>::decode(const int32_t* tokens, int B, int Tq) {
  TETRAD_CHECK(cache_ && cache_->B == B, "start_cache(B) must precede decode");
  forward(tokens, B, Tq, cache_->pos, true);
  cache_->pos += Tq;
  // Logits of the last new token of each sequence only: rows (b*Tq + Tq-1) of lnf.
  const int64_t C = cfg_.n_embd;
  head_logits(B, int64_t(Tq - 1) * C, int64_t(Tq) * C);
  return a_->logits;
}

// ---- the mixture of experts, token by token (the parallel model's is moe_block.cpp) -----------

template <typename T>
void Transformer<T>::moe_forward(int l, int64_t N) {
  const Layer& L = layers_[size_t(l)];
  auto& A = a_->layer[size_t(l)];
  MoeLayer& M = moe_[size_t(l)];
  const int64_t C = cfg_.n_embd, F = cfg_.ffn, E = cfg_.n_experts, K = cfg_.experts_per_token;
  const T* P = params_.data();
  std::vector<T> logits(size_t(N * E));
  k::linear_forward(logits.data(), A.ln2, P + L.router, static_cast<const T*>(nullptr), N, C, E);
  M.probs.assign(size_t(N * E), T(0));
  M.lse.assign(size_t(N), T(0));
  M.choice.assign(size_t(N * K), -1);
  M.weight.assign(size_t(N * K), T(0));
  M.kept.assign(size_t(N * K), 0);
  M.routed.assign(size_t(E), 0);
  M.h.assign(size_t(N * K * 2 * F), T(0));
  M.act.assign(size_t(N * K * F), T(0));
  M.out.assign(size_t(N * K * C), T(0));
  T zsum = 0;
  for (int64_t t = 0; t < N; ++t) {
    const T* z = logits.data() + t * E;
    T* p = M.probs.data() + t * E;
    T mx = z[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, z[e]);
    T s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(z[e] - mx);
    for (int64_t e = 0; e < E; ++e) p[e] = std::exp(z[e] - mx) / s;
    M.lse[size_t(t)] = mx + std::log(s);
    zsum += M.lse[size_t(t)] * M.lse[size_t(t)];
    // top k by selection: the highest score (probability, + the expert bias when there is one:
    // it chooses, it does not weigh) not yet taken, lower index on ties
    std::vector<char> taken(size_t(E), 0);
    std::vector<double> score(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      score[size_t(e)] = double(p[e]) + (L.expert_bias >= 0 ? double(P[L.expert_bias + e]) : 0.0);
    T sel = 0;
    for (int64_t j = 0; j < K; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[size_t(e)] && (best < 0 || score[size_t(e)] > score[size_t(best)])) best = e;
      taken[size_t(best)] = 1;
      M.choice[size_t(t * K + j)] = int32_t(best);
      sel += p[best];
      ++M.routed[size_t(best)];
    }
    for (int64_t j = 0; j < K; ++j) {
      const T pe = p[M.choice[size_t(t * K + j)]];
      M.weight[size_t(t * K + j)] = cfg_.moe_renormalize() ? pe / sel : pe;
    }
  }
  // Capacity: each expert takes its choices in token order up to ceil(factor N k / E).
  int64_t cap = N;
  if (cfg_.moe_capacity_factor > 0)
    cap = std::min<int64_t>(N, int64_t(std::ceil(double(cfg_.moe_capacity_factor) * double(N) *
                                                  double(K) / double(E))));
  std::vector<int64_t> taken_rows(size_t(E), 0);
  for (int64_t i = 0; i < N * K; ++i) {
    const int32_t e = M.choice[size_t(i)];
    if (taken_rows[size_t(e)] < cap) {
      ++taken_rows[size_t(e)];
      M.kept[size_t(i)] = 1;
    }
  }
  for (int64_t e = 0; e < E; ++e) {
    expert_rows_[size_t(e)] += taken_rows[size_t(e)];
    expert_load_[size_t(l * E + e)] = M.routed[size_t(e)];
  }
  // Each kept choice through its expert's SwiGLU MLP, weighted into the token's output.
  std::memcpy(A.resid_out, A.resid_mid, size_t(N * C) * sizeof(T));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t i = t * K + j;
      if (!M.kept[size_t(i)]) continue;
      const int64_t e = M.choice[size_t(i)];
      const T* w13 = P + L.gate_up + e * 2 * F * C;
      const T* w2 = P + L.down + e * C * F;
      const T* xt = A.ln2 + t * C;
      T* h = M.h.data() + i * 2 * F;
      T* act = M.act.data() + i * F;
      T* out = M.out.data() + i * C;
      for (int64_t r = 0; r < 2 * F; ++r) {
        T acc = 0;
        for (int64_t c = 0; c < C; ++c) acc += w13[r * C + c] * xt[c];
        h[r] = acc;
      }
      for (int64_t f = 0; f < F; ++f) act[f] = h[f] / (T(1) + std::exp(-h[f])) * h[F + f];
      for (int64_t c = 0; c < C; ++c) {
        T acc = 0;
        for (int64_t f = 0; f < F; ++f) acc += w2[c * F + f] * act[f];
        out[c] = acc;
        A.resid_out[t * C + c] += M.weight[size_t(i)] * acc;
      }
    }
  // The shared expert (Qwen2-MoE): resid_out += sigmoid(x · w_gate) * down(SwiGLU(x · gate|upᵀ)).
  if (L.shared_gu >= 0) {
    const int64_t Fs = cfg_.shared_expert_ffn;
    M.sh.assign(size_t(N * 2 * Fs), T(0));
    M.sact.assign(size_t(N * Fs), T(0));
    M.sout.assign(size_t(N * C), T(0));
    M.sgate.assign(size_t(N), T(0));
    for (int64_t t = 0; t < N; ++t) {
      const T* xt = A.ln2 + t * C;
      T* h = M.sh.data() + t * 2 * Fs;
      T* act = M.sact.data() + t * Fs;
      T* out = M.sout.data() + t * C;
      T g = 0;
      for (int64_t c = 0; c < C; ++c) g += P[L.shared_gate + c] * xt[c];
      M.sgate[size_t(t)] = T(1) / (T(1) + std::exp(-g));
      for (int64_t r = 0; r < 2 * Fs; ++r) {
        T acc = 0;
        for (int64_t c = 0; c < C; ++c) acc += P[L.shared_gu + r * C + c] * xt[c];
        h[r] = acc;
      }
      for (int64_t f = 0; f < Fs; ++f) act[f] = h[f] / (T(1) + std::exp(-h[f])) * h[Fs + f];
      for (int64_t c = 0; c < C; ++c) {
        T acc = 0;
        for (int64_t f = 0; f < Fs; ++f) acc += P[L.shared_down + c * Fs + f] * act[f];
        out[c] = acc;
        A.resid_out[t * C + c] += M.sgate[size_t(t)] * acc;
      }
    }
  }
  // The router's losses: E Σ_e f_e P_e (f_e = routed_e / N) and mean_t lse², over the layers.
  T aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    T Pe = 0;
    for (int64_t t = 0; t < N; ++t) Pe += M.probs[size_t(t * E + e)];
    aux += T(M.routed[size_t(e)]) / T(N) * Pe / T(N);
  }
  aux *= T(E);
  mean_aux_ += double(aux) / cfg_.n_layer;
  const double coef_aux = cfg_.moe_aux_loss() ? cfg_.router_aux_loss_coef : 0.0;
  router_loss_ += double(N) * (coef_aux * double(aux) + double(cfg_.router_z_loss_coef) *
                                                          double(zsum / T(N))) / cfg_.n_layer;
}

template <typename T>
void Transformer<T>::moe_backward(int l, int64_t N) {
  const Layer& L = layers_[size_t(l)];
  auto& A = a_->layer[size_t(l)];
  const MoeLayer& M = moe_[size_t(l)];
  Acts& a = *a_;
  const int64_t C = cfg_.n_embd, F = cfg_.ffn, E = cfg_.n_experts, K = cfg_.experts_per_token;
  const T* P = params_.data();
  T* G = grads_.data();
  std::fill(a.dln, a.dln + N * C, T(0));
  std::vector<T> dw(size_t(N * K), T(0)), dact(static_cast<size_t>(F)), dh(size_t(2 * F));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t i = t * K + j;
      if (!M.kept[size_t(i)]) continue;
      const int64_t e = M.choice[size_t(i)];
      const T* w13 = P + L.gate_up + e * 2 * F * C;
      const T* w2 = P + L.down + e * C * F;
      T* g13 = G + L.gate_up + e * 2 * F * C;
      T* g2 = G + L.down + e * C * F;
      const T* dy = a.dresid + t * C;
      const T* h = M.h.data() + i * 2 * F;
      const T* act = M.act.data() + i * F;
      const T* out = M.out.data() + i * C;
      const T w = M.weight[size_t(i)];
      T s = 0;
      for (int64_t c = 0; c < C; ++c) s += dy[c] * out[c];
      dw[size_t(i)] = s;
      std::fill(dact.begin(), dact.end(), T(0));
      for (int64_t c = 0; c < C; ++c) {
        const T dout = w * dy[c];
        for (int64_t f = 0; f < F; ++f) {
          dact[size_t(f)] += w2[c * F + f] * dout;
          g2[c * F + f] += dout * act[f];
        }
      }
      for (int64_t f = 0; f < F; ++f) {
        const T g = h[f], u = h[F + f], sg = T(1) / (T(1) + std::exp(-g));
        dh[size_t(f)] = dact[size_t(f)] * u * sg * (T(1) + g * (T(1) - sg));
        dh[size_t(F + f)] = dact[size_t(f)] * g * sg;
      }
      const T* xt = A.ln2 + t * C;
      for (int64_t r = 0; r < 2 * F; ++r)
        for (int64_t c = 0; c < C; ++c) {
          a.dln[t * C + c] += w13[r * C + c] * dh[size_t(r)];
          g13[r * C + c] += dh[size_t(r)] * xt[c];
        }
    }
  // The router: combine weights -> probabilities (renormalised or not) -> logits, with the
  // auxiliary loss (f_e constant) and the z-loss, weighted as router_loss() says.
  const T per_layer = grad_scale_ * T(N) / T(cfg_.n_layer);
  const T aux_scale = cfg_.moe_aux_loss() ? per_layer * T(cfg_.router_aux_loss_coef) : T(0);
  const T z_scale = per_layer * T(cfg_.router_z_loss_coef);
  std::vector<T> dlogits(size_t(N * E)), dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    const T* p = M.probs.data() + t * E;
    std::fill(dp.begin(), dp.end(), T(0));
    T S = 0;
    for (int64_t j = 0; j < K; ++j) S += p[M.choice[size_t(t * K + j)]];
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = M.choice[size_t(t * K + j)];
      if (!cfg_.moe_renormalize()) {
        dp[size_t(e)] += dw[size_t(t * K + j)];
        continue;
      }
      // w_j = p_j / S: d w_j / d p_m = ([j == m] - w_j) / S for the chosen m
      for (int64_t m = 0; m < K; ++m) {
        const int64_t em = M.choice[size_t(t * K + m)];
        dp[size_t(em)] += dw[size_t(t * K + j)] * ((j == m ? T(1) : T(0)) - p[e] / S) / S;
      }
    }
    for (int64_t e = 0; e < E; ++e)
      dp[size_t(e)] += aux_scale * T(E) * T(M.routed[size_t(e)]) / T(N) / T(N);
    T pdp = 0;
    for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp[size_t(e)];
    for (int64_t e = 0; e < E; ++e)
      dlogits[size_t(t * E + e)] =
          p[e] * (dp[size_t(e)] - pdp) + z_scale * T(2) * M.lse[size_t(t)] / T(N) * p[e];
  }
  for (int64_t t = 0; t < N; ++t)
    for (int64_t e = 0; e < E; ++e) {
      const T d = dlogits[size_t(t * E + e)];
      for (int64_t c = 0; c < C; ++c) {
        a.dln[t * C + c] += d * P[L.router + e * C + c];
        G[L.router + e * C + c] += d * A.ln2[t * C + c];
      }
    }
  if (L.shared_gu < 0) return;
  // The shared expert, token by token: d out = s dy, ds = dy · out, d gate logit = s (1 - s) ds.
  const int64_t Fs = cfg_.shared_expert_ffn;
  std::vector<T> sdact(static_cast<size_t>(Fs)), sdh(size_t(2 * Fs));
  for (int64_t t = 0; t < N; ++t) {
    const T* dy = a.dresid + t * C;
    const T* xt = A.ln2 + t * C;
    const T* h = M.sh.data() + t * 2 * Fs;
    const T* act = M.sact.data() + t * Fs;
    const T* out = M.sout.data() + t * C;
    const T s = M.sgate[size_t(t)];
    T ds = 0;
    for (int64_t c = 0; c < C; ++c) ds += dy[c] * out[c];
    const T dg = s * (T(1) - s) * ds;
    for (int64_t c = 0; c < C; ++c) {
      a.dln[t * C + c] += dg * P[L.shared_gate + c];
      G[L.shared_gate + c] += dg * xt[c];
    }
    std::fill(sdact.begin(), sdact.end(), T(0));
    for (int64_t c = 0; c < C; ++c) {
      const T dout = s * dy[c];
      for (int64_t f = 0; f < Fs; ++f) {
        sdact[size_t(f)] += P[L.shared_down + c * Fs + f] * dout;
        G[L.shared_down + c * Fs + f] += dout * act[f];
      }
    }
    for (int64_t f = 0; f < Fs; ++f) {
      const T g = h[f], u = h[Fs + f], sg = T(1) / (T(1) + std::exp(-g));
      sdh[size_t(f)] = sdact[size_t(f)] * u * sg * (T(1) + g * (T(1) - sg));
      sdh[size_t(Fs + f)] = sdact[size_t(f)] * g * sg;
    }
    for (int64_t r = 0; r < 2 * Fs; ++r)
      for (int64_t c = 0; c < C; ++c) {
        a.dln[t * C + c] += P[L.shared_gu + r * C + c] * sdh[size_t(r)];
        G[L.shared_gu + r * C + c] += sdh[size_t(r)] * xt[c];
      }
  }
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace tetrad
