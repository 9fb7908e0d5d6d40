#include "tetrad/backend/cpu/strict_backend.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <vector>

#include "tetrad/backend/cpu/cpu_backend.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::backend::cpu {

namespace {

StrictBackend& strict(Queue& q) { return static_cast<StrictBackend&>(q.backend()); }
// The CPU backend's queue behind a strict queue (the CPU ops ignore it beyond its type).
Queue& cpu_queue(Queue& q) { return strict(q).cpu().queue(); }
template <typename T>
T* at(Queue& q, T* p, const char* op, const char* arg) {
  return static_cast<T*>(strict(q).data_of(p, op, arg));
}
const OpTable& cpu_ops() { return op_table(); }

// ---- the queue: inline, translating ------------------------------------------------------------

class StrictQueue final : public Queue {
 public:
  explicit StrictQueue(StrictBackend& b) : Queue(b), be_(b) {}
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    host_side(src, "copy_to_device", "source");
    std::memmove(be_.data_of(dst, "copy_to_device", "destination"), src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    host_side(dst, "copy_to_host", "destination");
    std::memmove(dst, be_.data_of(src, "copy_to_host", "source"), bytes);
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    std::memmove(be_.data_of(dst, "copy_on_device", "destination"),
                 be_.data_of(src, "copy_on_device", "source"), bytes);
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(be_.data_of(dst, "fill_zero", "destination"), 0, bytes);
  }
  Event record() override { return Event(); }  // inline: everything submitted has run
  void wait(const Event& e) override { e.synchronize(); }
  void synchronize() override {}

 private:
  void host_side(const void* p, const char* op, const char* arg) const {
    if (!be_.host_readable(p))
      fail("cpu-strict: ", op, " ", arg, " is device memory of this backend; expected host memory "
           "(copy_on_device copies between device buffers)");
  }
  StrictBackend& be_;
};

// ---- the op table: every pointer translated, then the CPU op -----------------------------------

#define T_(p, op, arg) at(q, p, op, arg)

HeadNormArgs head_norm_args(Queue& q, const HeadNormArgs& a, const char* op) {
  HeadNormArgs h = a;
  h.x = T_(a.x, op, "x");
  h.w = T_(a.w, op, "w");
  h.rstd = T_(a.rstd, op, "rstd");
  h.saved = T_(a.saved, op, "saved");
  h.dw = T_(a.dw, op, "dw");
  return h;
}

// The mixture of experts' ops (grouped GEMM, permutation), translated as every other op.
void add_moe_ops(OpTable& t) {
  t.grouped_gemm = [](Queue& q, const GroupedGemmArgs& g) {
    const size_t n = size_t(std::max<int64_t>(g.groups, 0));
    std::vector<const void*> A(n), B(n);
    std::vector<float*> C(n);
    for (size_t i = 0; i < n; ++i) {
      // An empty group's pointers are never read (the CPU's gemm returns first).
      const bool empty = g.M[i] == 0 || g.N[i] == 0;
      A[i] = empty || g.K[i] == 0 ? g.A[i] : T_(g.A[i], "grouped_gemm", "A");
      B[i] = empty || g.K[i] == 0 ? g.B[i] : T_(g.B[i], "grouped_gemm", "B");
      C[i] = empty ? g.C[i] : T_(g.C[i], "grouped_gemm", "C");
    }
    GroupedGemmArgs h = g;
    h.A = A.data();
    h.B = B.data();
    h.C = C.data();
    cpu_ops().grouped_gemm(cpu_queue(q), h);
  };
  t.moe_permute = [](Queue& q, float* out, const float* x, const int32_t* s, int64_t N,
                     int64_t k, int64_t C) {
    const char* o = "moe_permute";
    cpu_ops().moe_permute(cpu_queue(q), T_(out, o, "out"), T_(x, o, "x"), T_(s, o, "slots"), N,
                          k, C);
  };
  t.moe_permute_backward = [](Queue& q, float* dx, const float* d, const int32_t* s, int64_t N,
                              int64_t k, int64_t C) {
    const char* o = "moe_permute_backward";
    cpu_ops().moe_permute_backward(cpu_queue(q), T_(dx, o, "dx"), T_(d, o, "dout"),
                                   T_(s, o, "slots"), N, k, C);
  };
  t.moe_unpermute = [](Queue& q, float* y, const float* e, const float* w, const int32_t* s,
                       int64_t N, int64_t k, int64_t C) {
    const char* o = "moe_unpermute";
    cpu_ops().moe_unpermute(cpu_queue(q), T_(y, o, "y"), T_(e, o, "e"), T_(w, o, "w"),
                            T_(s, o, "slots"), N, k, C);
  };
  t.moe_unpermute_backward = [](Queue& q, float* de, float* dw, const float* dy, const float* e,
                                const float* w, const int32_t* s, int64_t N, int64_t k,
                                int64_t C) {
    const char* o = "moe_unpermute_backward";
    cpu_ops().moe_unpermute_backward(cpu_queue(q), T_(de, o, "de"), T_(dw, o, "dw"),
                                     T_(dy, o, "dy"), T_(e, o, "e"), T_(w, o, "w"),
                                     T_(s, o, "slots"), N, k, C);
  };
}

// The bf16 stash's fused producers and consumers (Capabilities::bf16_stash_fused).
void add_stash_ops(OpTable& t) {
  t.gelu_forward_bf16_x = [](Queue& q, uint16_t* out, uint16_t* x16, const float* x, int64_t n) {
    const char* o = "gelu_forward_bf16_x";
    cpu_ops().gelu_forward_bf16_x(cpu_queue(q), T_(out, o, "out"), T_(x16, o, "x16"), T_(x, o, "x"), n);
  };
  t.swiglu_forward_bf16_x = [](Queue& q, uint16_t* out, uint16_t* gu16, const float* gu, int64_t N,
                               int64_t F) {
    const char* o = "swiglu_forward_bf16_x";
    cpu_ops().swiglu_forward_bf16_x(cpu_queue(q), T_(out, o, "out"), T_(gu16, o, "gu16"),
                                    T_(gu, o, "gu"), N, F);
  };
  t.gelu_backward_x16 = [](Queue& q, float* dx, const float* d, const uint16_t* x16, int64_t n) {
    const char* o = "gelu_backward_x16";
    cpu_ops().gelu_backward_x16(cpu_queue(q), T_(dx, o, "dx"), T_(d, o, "dout"), T_(x16, o, "x16"), n);
  };
  t.swiglu_backward_x16 = [](Queue& q, float* dgu, const float* d, const uint16_t* gu16, int64_t N,
                             int64_t F) {
    const char* o = "swiglu_backward_x16";
    cpu_ops().swiglu_backward_x16(cpu_queue(q), T_(dgu, o, "dgu"), T_(d, o, "dout"),
                                  T_(gu16, o, "gu16"), N, F);
  };
}

OpTable make_strict_table() {
  OpTable t;
  t.gemm = [](Queue& q, const GemmArgs& g) {
    GemmArgs h = g;
    h.A = T_(g.A, "gemm", "A");
    h.B = T_(g.B, "gemm", "B");
    h.C = T_(g.C, "gemm", "C");
    cpu_ops().gemm(cpu_queue(q), h);
  };
  t.bias_add = [](Queue& q, float* out, const float* b, int64_t N, int64_t n) {
    cpu_ops().bias_add(cpu_queue(q), T_(out, "bias_add", "out"), T_(b, "bias_add", "b"), N, n);
  };
  t.residual_add = [](Queue& q, float* out, const float* r, const float* y, const float* b,
                      int64_t N, int64_t C) {
    cpu_ops().residual_add(cpu_queue(q), T_(out, "residual_add", "out"),
                           T_(r, "residual_add", "resid"), T_(y, "residual_add", "y"),
                           T_(b, "residual_add", "b"), N, C);
  };
  t.add = [](Queue& q, float* x, const float* y, int64_t n) {
    cpu_ops().add(cpu_queue(q), T_(x, "add", "x"), T_(y, "add", "y"), n);
  };
  t.bias_grad = [](Queue& q, float* db, const float* d, int64_t N, int64_t n) {
    cpu_ops().bias_grad(cpu_queue(q), T_(db, "bias_grad", "db"), T_(d, "bias_grad", "dout"), N, n);
  };
  t.norm_row_stats = [](Queue& q, RowStat s, double* st, int64_t stride, const float* x,
                        const float* mean, int64_t N, int64_t C) {
    cpu_ops().norm_row_stats(cpu_queue(q), s, T_(st, "norm_row_stats", "stats"), stride,
                             T_(x, "norm_row_stats", "x"), T_(mean, "norm_row_stats", "mean"), N, C);
  };
  t.norm_finish_stats = [](Queue& q, StatFinish f, float* out, const double* st, int64_t N,
                           int64_t C, float eps) {
    cpu_ops().norm_finish_stats(cpu_queue(q), f, T_(out, "norm_finish_stats", "out"),
                                T_(st, "norm_finish_stats", "stats"), N, C, eps);
  };
  t.norm_apply = [](Queue& q, float* out, const float* x, const float* mean, const float* rstd,
                    const float* w, const float* b, int64_t N, int64_t C) {
    cpu_ops().norm_apply(cpu_queue(q), T_(out, "norm_apply", "out"), T_(x, "norm_apply", "x"),
                         T_(mean, "norm_apply", "mean"), T_(rstd, "norm_apply", "rstd"),
                         T_(w, "norm_apply", "w"), T_(b, "norm_apply", "b"), N, C);
  };
  t.norm_backward_partials = [](Queue& q, double* p, const float* d, const float* x,
                                const float* mean, const float* rstd, const float* w, int64_t N,
                                int64_t C) {
    const char* o = "norm_backward_partials";
    cpu_ops().norm_backward_partials(cpu_queue(q), T_(p, o, "partials"), T_(d, o, "dout"),
                                     T_(x, o, "x"), T_(mean, o, "mean"), T_(rstd, o, "rstd"),
                                     T_(w, o, "w"), N, C);
  };
  t.norm_backward_apply = [](Queue& q, float* dx, const float* d, const float* x,
                             const float* mean, const float* rstd, const float* w,
                             const double* p, int64_t N, int64_t C, int64_t Cf) {
    const char* o = "norm_backward_apply";
    cpu_ops().norm_backward_apply(cpu_queue(q), T_(dx, o, "dx"), T_(d, o, "dout"), T_(x, o, "x"),
                                  T_(mean, o, "mean"), T_(rstd, o, "rstd"), T_(w, o, "w"),
                                  T_(p, o, "partials"), N, C, Cf);
  };
  t.norm_param_grads = [](Queue& q, float* dw, float* db, const float* d, const float* x,
                          const float* mean, const float* rstd, int64_t N, int64_t C) {
    const char* o = "norm_param_grads";
    cpu_ops().norm_param_grads(cpu_queue(q), T_(dw, o, "dw"), T_(db, o, "db"), T_(d, o, "dout"),
                               T_(x, o, "x"), T_(mean, o, "mean"), T_(rstd, o, "rstd"), N, C);
  };
  t.attention_forward = [](Queue& q, const AttentionArgs& a, void* out, float* lse,
                           const void* qp, const void* kp, const void* vp) {
    const char* o = "attention_forward";
    AttentionArgs h = a;
    h.doc_start = T_(a.doc_start, o, "doc_start");
    cpu_ops().attention_forward(cpu_queue(q), h, T_(out, o, "out"), T_(lse, o, "lse"),
                                T_(qp, o, "q"), T_(kp, o, "k"), T_(vp, o, "v"));
  };
  t.attention_backward = [](Queue& q, const AttentionArgs& a, void* dq, void* dk, void* dv,
                            const void* dout, const void* qp, const void* kp, const void* vp,
                            const void* out, const float* lse) {
    const char* o = "attention_backward";
    AttentionArgs h = a;
    h.doc_start = T_(a.doc_start, o, "doc_start");
    cpu_ops().attention_backward(cpu_queue(q), h, T_(dq, o, "dq"), T_(dk, o, "dk"),
                                 T_(dv, o, "dv"), T_(dout, o, "dout"), T_(qp, o, "q"),
                                 T_(kp, o, "k"), T_(vp, o, "v"), T_(out, o, "out"),
                                 T_(lse, o, "lse"));
  };
  t.attention_merge = [](Queue& q, const AttentionArgs& a, void* out, float* lse,
                         const void* out_b, const float* lse_b) {
    const char* o = "attention_merge";
    cpu_ops().attention_merge(cpu_queue(q), a, T_(out, o, "out"), T_(lse, o, "lse"),
                              T_(out_b, o, "out_b"), T_(lse_b, o, "lse_b"));
  };
  t.rope_forward = [](Queue& q, const RopeArgs& r) {
    RopeArgs h = r;
    h.x = T_(r.x, "rope_forward", "x");
    h.cos = T_(r.cos, "rope_forward", "cos");
    h.sin = T_(r.sin, "rope_forward", "sin");
    h.doc_start = T_(r.doc_start, "rope_forward", "doc_start");
    cpu_ops().rope_forward(cpu_queue(q), h);
  };
  t.rope_backward = [](Queue& q, const RopeArgs& r) {
    RopeArgs h = r;
    h.x = T_(r.x, "rope_backward", "x");
    h.cos = T_(r.cos, "rope_backward", "cos");
    h.sin = T_(r.sin, "rope_backward", "sin");
    h.doc_start = T_(r.doc_start, "rope_backward", "doc_start");
    cpu_ops().rope_backward(cpu_queue(q), h);
  };
  t.head_norm_forward = [](Queue& q, const HeadNormArgs& a) {
    cpu_ops().head_norm_forward(cpu_queue(q), head_norm_args(q, a, "head_norm_forward"));
  };
  t.head_norm_backward = [](Queue& q, const HeadNormArgs& a) {
    cpu_ops().head_norm_backward(cpu_queue(q), head_norm_args(q, a, "head_norm_backward"));
  };
  t.gelu_forward = [](Queue& q, float* out, const float* x, int64_t n) {
    cpu_ops().gelu_forward(cpu_queue(q), T_(out, "gelu_forward", "out"), T_(x, "gelu_forward", "x"), n);
  };
  t.gelu_backward = [](Queue& q, float* dx, const float* d, const float* x, int64_t n) {
    cpu_ops().gelu_backward(cpu_queue(q), T_(dx, "gelu_backward", "dx"),
                            T_(d, "gelu_backward", "dout"), T_(x, "gelu_backward", "x"), n);
  };
  t.swiglu_forward = [](Queue& q, float* out, const float* gu, int64_t N, int64_t F) {
    cpu_ops().swiglu_forward(cpu_queue(q), T_(out, "swiglu_forward", "out"),
                             T_(gu, "swiglu_forward", "gu"), N, F);
  };
  t.swiglu_backward = [](Queue& q, float* dgu, const float* d, const float* gu, int64_t N,
                         int64_t F) {
    cpu_ops().swiglu_backward(cpu_queue(q), T_(dgu, "swiglu_backward", "dgu"),
                              T_(d, "swiglu_backward", "dout"), T_(gu, "swiglu_backward", "gu"),
                              N, F);
  };
  t.embedding_gather = [](Queue& q, float* out, const int32_t* tok, const float* table,
                          int64_t v0, int64_t Vs, int64_t N, int64_t C) {
    const char* o = "embedding_gather";
    cpu_ops().embedding_gather(cpu_queue(q), T_(out, o, "out"), T_(tok, o, "tokens"),
                               T_(table, o, "table"), v0, Vs, N, C);
  };
  t.position_add = [](Queue& q, float* out, const float* pos, int64_t N, int64_t T, int64_t C) {
    cpu_ops().position_add(cpu_queue(q), T_(out, "position_add", "out"),
                           T_(pos, "position_add", "pos"), N, T, C);
  };
  t.embedding_scatter_add = [](Queue& q, float* d, int64_t s0, int64_t s1, const float* dout,
                               const int32_t* tok, int64_t v0, int64_t Vs, int64_t N, int64_t C) {
    const char* o = "embedding_scatter_add";
    cpu_ops().embedding_scatter_add(cpu_queue(q), T_(d, o, "dshard"), s0, s1, T_(dout, o, "dout"),
                                    T_(tok, o, "tokens"), v0, Vs, N, C);
  };
  t.position_grad = [](Queue& q, float* dpos, const float* d, int64_t N, int64_t T, int64_t C) {
    cpu_ops().position_grad(cpu_queue(q), T_(dpos, "position_grad", "dpos"),
                            T_(d, "position_grad", "dout"), N, T, C);
  };
  t.ce_row_max = [](Queue& q, float* mx, const float* L, int64_t N, int64_t Vs) {
    cpu_ops().ce_row_max(cpu_queue(q), T_(mx, "ce_row_max", "mx"), T_(L, "ce_row_max", "logits"),
                         N, Vs);
  };
  t.ce_sum_exp_target = [](Queue& q, double* st, const float* L, const float* mx,
                           const int32_t* tg, int64_t v0, int64_t Vs, int64_t N) {
    const char* o = "ce_sum_exp_target";
    cpu_ops().ce_sum_exp_target(cpu_queue(q), T_(st, o, "stats"), T_(L, o, "logits"),
                                T_(mx, o, "mx"), T_(tg, o, "targets"), v0, Vs, N);
  };
  t.ce_loss = [](Queue& q, float* losses, double* total, const double* st, const float* mx,
                 const int32_t* tg, int64_t N) {
    const char* o = "ce_loss";
    cpu_ops().ce_loss(cpu_queue(q), T_(losses, o, "losses"), T_(total, o, "total"),
                      T_(st, o, "stats"), T_(mx, o, "mx"), T_(tg, o, "targets"), N);
  };
  t.ce_grad = [](Queue& q, float* L, const float* mx, const double* st, const int32_t* tg,
                 int64_t v0, int64_t Vs, int64_t N, float gs) {
    const char* o = "ce_grad";
    cpu_ops().ce_grad(cpu_queue(q), T_(L, o, "logits"), T_(mx, o, "mx"), T_(st, o, "stats"),
                      T_(tg, o, "targets"), v0, Vs, N, gs);
  };
  t.row_argmax = [](Queue& q, int32_t* idx, float* val, const float* L, int64_t N, int64_t Vs,
                    int64_t ld) {
    cpu_ops().row_argmax(cpu_queue(q), T_(idx, "row_argmax", "idx"), T_(val, "row_argmax", "val"),
                         T_(L, "row_argmax", "logits"), N, Vs, ld);
  };
  t.sum_squares = [](Queue& q, double* out, const float* x, int64_t n) {
    cpu_ops().sum_squares(cpu_queue(q), T_(out, "sum_squares", "out"), T_(x, "sum_squares", "x"), n);
  };
  t.cast_f32_to_bf16 = [](Queue& q, uint16_t* out, const float* x, int64_t n) {
    cpu_ops().cast_f32_to_bf16(cpu_queue(q), T_(out, "cast_f32_to_bf16", "out"),
                               T_(x, "cast_f32_to_bf16", "x"), n);
  };
  t.cast_bf16_to_f32 = [](Queue& q, float* out, const uint16_t* x, int64_t n) {
    cpu_ops().cast_bf16_to_f32(cpu_queue(q), T_(out, "cast_bf16_to_f32", "out"),
                               T_(x, "cast_bf16_to_f32", "x"), n);
  };
  t.round_to_bf16 = [](Queue& q, float* x, int64_t n) {
    cpu_ops().round_to_bf16(cpu_queue(q), T_(x, "round_to_bf16", "x"), n);
  };
  t.adamw = [](Queue& q, const AdamWArgs& a) {
    AdamWArgs h = a;
    h.p = T_(a.p, "adamw", "p");
    h.g = T_(a.g, "adamw", "g");
    h.m = T_(a.m, "adamw", "m");
    h.v = T_(a.v, "adamw", "v");
    h.p16 = T_(a.p16, "adamw", "p16");
    cpu_ops().adamw(cpu_queue(q), h);
  };
  t.cross_entropy_fused = [](Queue& q, float* L, float* losses, double* total, const int32_t* tg,
                             int64_t N, int64_t V, float gs) {
    const char* o = "cross_entropy_fused";
    cpu_ops().cross_entropy_fused(cpu_queue(q), T_(L, o, "logits"), T_(losses, o, "losses"),
                                  T_(total, o, "total"), T_(tg, o, "targets"), N, V, gs);
  };
  t.norm_apply_bf16 = [](Queue& q, uint16_t* out, const float* x, const float* mean,
                         const float* rstd, const float* w, const float* b, int64_t N, int64_t C) {
    const char* o = "norm_apply_bf16";
    cpu_ops().norm_apply_bf16(cpu_queue(q), T_(out, o, "out"), T_(x, o, "x"), T_(mean, o, "mean"),
                              T_(rstd, o, "rstd"), T_(w, o, "w"), T_(b, o, "b"), N, C);
  };
  t.gelu_forward_bf16 = [](Queue& q, uint16_t* out, const float* x, int64_t n) {
    cpu_ops().gelu_forward_bf16(cpu_queue(q), T_(out, "gelu_forward_bf16", "out"),
                                T_(x, "gelu_forward_bf16", "x"), n);
  };
  t.swiglu_forward_bf16 = [](Queue& q, uint16_t* out, const float* gu, int64_t N, int64_t F) {
    cpu_ops().swiglu_forward_bf16(cpu_queue(q), T_(out, "swiglu_forward_bf16", "out"),
                                  T_(gu, "swiglu_forward_bf16", "gu"), N, F);
  };
  t.cast_transpose_f32_to_bf16 = [](Queue& q, uint16_t* out, uint16_t* out_t, const float* x,
                                    int64_t rows, int64_t cols) {
    const char* o = "cast_transpose_f32_to_bf16";
    cpu_ops().cast_transpose_f32_to_bf16(cpu_queue(q), T_(out, o, "out"), T_(out_t, o, "out_t"),
                                         T_(x, o, "x"), rows, cols);
  };
  t.ce_row_max_sum_exp_target = [](Queue& q, float* mx, double* st, const float* L,
                                   const int32_t* tg, int64_t v0, int64_t Vs, int64_t N) {
    const char* o = "ce_row_max_sum_exp_target";
    cpu_ops().ce_row_max_sum_exp_target(cpu_queue(q), T_(mx, o, "mx"), T_(st, o, "stats"),
                                        T_(L, o, "logits"), T_(tg, o, "targets"), v0, Vs, N);
  };
  t.ce_grad_bf16 = [](Queue& q, uint16_t* out, uint16_t* out_t, const float* L, const float* mx,
                      const double* st, const int32_t* tg, int64_t v0, int64_t Vs, int64_t N,
                      float gs) {
    const char* o = "ce_grad_bf16";
    cpu_ops().ce_grad_bf16(cpu_queue(q), T_(out, o, "out"), T_(out_t, o, "out_t"),
                           T_(L, o, "logits"), T_(mx, o, "mx"), T_(st, o, "stats"),
                           T_(tg, o, "targets"), v0, Vs, N, gs);
  };
  add_moe_ops(t);
  add_stash_ops(t);
  return t;
}

#undef T_

// Every entry the CPU table fills must have a translating wrapper here: an op added to the seam
// and to the CPU backend but not here would otherwise be a null pointer the model calls (the
// capabilities are the CPU's). The table is a struct of function pointers only.
void check_covers_cpu(const OpTable& strict_table) {
  using Slot = void (*)();
  static_assert(sizeof(OpTable) % sizeof(Slot) == 0, "OpTable holds function pointers only");
  constexpr size_t n = sizeof(OpTable) / sizeof(Slot);
  Slot cpu_slots[n], strict_slots[n];
  std::memcpy(cpu_slots, &op_table(), sizeof(OpTable));
  std::memcpy(strict_slots, &strict_table, sizeof(OpTable));
  for (size_t i = 0; i < n; ++i)
    if (cpu_slots[i] && !strict_slots[i])
      fail("cpu-strict: op table entry ", i, " (in ops.hpp order) is filled by the cpu backend "
           "but has no translating wrapper in backend/cpu/strict_backend.cpp");
}

size_t page_size() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}

}  // namespace

StrictBackend::StrictBackend() : cpu_(std::make_unique<CpuBackend>()) {
  caps_ = cpu_->capabilities();
  caps_.host_visible = false;
  queue_ = std::make_unique<StrictQueue>(*this);
}

StrictBackend::~StrictBackend() {
  queue_.reset();
  // Buffers outliving their backend are a caller bug; their mappings go with the process.
}

Backend& StrictBackend::cpu() { return *cpu_; }

const OpTable& StrictBackend::ops() const {
  static const OpTable t = [] {
    OpTable table = make_strict_table();
    check_op_table(table, "cpu-strict");
    check_covers_cpu(table);
    return table;
  }();
  return t;
}

std::string StrictBackend::description() const {
  return "cpu-strict: the cpu backend's ops on device memory the host cannot read (" +
         cpu_->description() + ")";
}

std::unique_ptr<Queue> StrictBackend::new_queue() { return std::make_unique<StrictQueue>(*this); }

DeviceCeilings StrictBackend::ceilings(int threads, bool quick) {
  return cpu_->ceilings(threads, quick);
}
DevicePeak StrictBackend::peak(Precision p, int threads) { return cpu_->peak(p, threads); }
PrecisionChoice StrictBackend::auto_precision() const { return cpu_->auto_precision(); }
Bf16Status StrictBackend::bf16_status() const { return cpu_->bf16_status(); }

bool StrictBackend::host_readable(const void* p) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return true;
  --it;
  return a >= it->first + it->second.mapped;  // outside every device range
}

void* StrictBackend::data_of(const void* p, const char* op, const char* arg) const {
  if (!p) return nullptr;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.upper_bound(a);
    if (it != regions_.begin()) {
      --it;
      const uintptr_t off = a - it->first;
      if (off <= it->second.bytes) return it->second.data + off;
    }
  }
  fail("cpu-strict: ", op, " argument ", arg, " (", p, ") is not device memory of this backend "
       "(a host pointer, host staging memory or a freed buffer given to the device)");
}

size_t StrictBackend::device_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

void* StrictBackend::allocate(size_t bytes, MemoryKind kind) {
  if (kind == MemoryKind::HostStaging) {
    const size_t rounded = ((bytes + 63) / 64) * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) fail("cpu-strict: out of host memory allocating ", bytes, " bytes of staging memory");
    std::memset(p, 0, rounded);
    return p;
  }
  const size_t mapped = (bytes + page_size() - 1) / page_size() * page_size();
  // The device addresses: reserved, never readable or writable (a host access faults).
  void* dev = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (dev == MAP_FAILED)
    fail("cpu-strict: cannot reserve ", bytes, " bytes of device address space: ",
         std::strerror(errno));
  // The data, zero-filled as fresh anonymous memory is.
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    const int e = errno;
    munmap(dev, mapped);
    fail("cpu-strict: cannot allocate ", bytes, " bytes of device memory: ", std::strerror(e));
  }
  std::lock_guard<std::mutex> lock(mu_);
  regions_[reinterpret_cast<uintptr_t>(dev)] = Region{static_cast<char*>(data), mapped, bytes};
  in_use_ += bytes;
  return dev;
}

void StrictBackend::deallocate(void* p, size_t, MemoryKind kind) noexcept {
  if (kind == MemoryKind::HostStaging) {
    std::free(p);
    return;
  }
  Region r{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(p));
    if (it == regions_.end()) return;
    r = it->second;
    in_use_ -= r.bytes;
    regions_.erase(it);
  }
  munmap(r.data, r.mapped);
  munmap(p, r.mapped);
}

}  // namespace tetrad::backend::cpu
