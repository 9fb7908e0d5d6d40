// The bf16 stash's fused producers and consumers (issue 28; ActStore::Bf16Stash in
// parallel/activation_layout.hpp): the block's stored tensors written in bf16 by the ops that
// compute them and read in bf16 by the backward ops, instead of separate cast passes. Each must
// give the bits of the unfused sequence (the fp32 op, a cast to bf16, a cast back, the fp32 op),
// which is what keeps bf16 runs bit-identical to the stash with its passes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/backend/bf16.hpp"
#include "tetrad/core/rng.hpp"

using namespace tetrad;
using backend::AttentionArgs;

namespace {

std::vector<float> normal(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * float(r.normal());
  return v;
}
std::vector<uint16_t> cast(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = backend::float_to_bf16(x[i]);
  return y;
}
std::vector<float> widen(const std::vector<uint16_t>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = backend::bf16_to_float(x[i]);
  return y;
}
template <class T>
void expect_bits(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << what << ": element " << i << " is " << got[i] << ", want " << want[i];
}

}  // namespace

// GELU and SwiGLU: the forward writes its input's bf16 copy beside its bf16 output (each the
// bits of the separate cast and of the bf16 producer), the backward reads that copy and gives
// the bits of the fp32 backward on the copy widened. Sizes across the kernels' 16384-element
// chunks and odd row widths.
TEST(Bf16Stash, MlpActivationWritesAndReadsItsInputsBf16Copy) {
  backend::Backend& be = backend::cpu_backend();
  ASSERT_TRUE(be.capabilities().bf16_stash_fused);
  const backend::OpTable& op = be.ops();
  backend::Queue& q = be.queue();
  for (int64_t n : {int64_t(1), int64_t(37), int64_t(16384 * 2 + 5)}) {
    SCOPED_TRACE(n);
    std::vector<float> x = normal(size_t(n), 1 + uint64_t(n), 3.0f), d = normal(size_t(n), 7);
    x[0] = 0.0f;
    std::vector<uint16_t> out(static_cast<size_t>(n)), x16(static_cast<size_t>(n), 0x7fc1), want_out(static_cast<size_t>(n));
    op.gelu_forward_bf16_x(q, out.data(), x16.data(), x.data(), n);
    op.gelu_forward_bf16(q, want_out.data(), x.data(), n);
    expect_bits(out, want_out, "gelu output");
    expect_bits(x16, cast(x), "gelu input copy");
    std::vector<float> dx(static_cast<size_t>(n)), want_dx(static_cast<size_t>(n));
    const std::vector<float> xw = widen(x16);
    op.gelu_backward_x16(q, dx.data(), d.data(), x16.data(), n);
    op.gelu_backward(q, want_dx.data(), d.data(), xw.data(), n);
    expect_bits(dx, want_dx, "gelu backward");
  }
  for (auto [N, F] : {std::pair<int64_t, int64_t>{1, 1}, {3, 37}, {9, 700}}) {
    SCOPED_TRACE(testing::Message() << N << " x " << F);
    const std::vector<float> gu = normal(size_t(N * 2 * F), uint64_t(N * F), 3.0f),
                             d = normal(size_t(N * F), 11);
    std::vector<uint16_t> out(size_t(N * F)), gu16(gu.size(), 0x7fc1), want_out(size_t(N * F));
    op.swiglu_forward_bf16_x(q, out.data(), gu16.data(), gu.data(), N, F);
    op.swiglu_forward_bf16(q, want_out.data(), gu.data(), N, F);
    expect_bits(out, want_out, "swiglu output");
    expect_bits(gu16, cast(gu), "swiglu input copy");
    std::vector<float> dgu(gu.size()), want_dgu(gu.size());
    const std::vector<float> guw = widen(gu16);
    op.swiglu_backward_x16(q, dgu.data(), d.data(), gu16.data(), N, F);
    op.swiglu_backward(q, want_dgu.data(), d.data(), guw.data(), N, F);
    expect_bits(dgu, want_dgu, "swiglu backward");
  }
}

// The attention's backward in bf16 products reading q|k|v and the output from their bf16 copies
// (AttentionArgs::saved_bf16) gives the bits of the backward on the copies widened to fp32: a
// fused q|k|v row as the model stores it, grouped-query heads, a document mask, a tail of a
// sequence not a multiple of the kernel's blocks, and denormal values (which the bf16 paths'
// rounding flushes).
TEST(Bf16Stash, AttentionBackwardReadsTheBf16CopiesOfItsInputs) {
  backend::Backend& be = backend::cpu_backend();
  if (!be.capabilities().attention_bf16_saved)
    GTEST_SKIP() << "[optional] no bf16 attention products here (Capabilities::attention_bf16_saved)";
  const backend::OpTable& op = be.ops();
  backend::Queue& q = be.queue();
  for (bool docs : {false, true}) {
    SCOPED_TRACE(docs ? "document mask" : "causal");
    const int B = 2, T = 45, nh = 4, nkv = 2, hd = 16;
    const int64_t QKV = (nh + 2 * nkv) * hd, A = nh * hd, k0 = nh * hd, v0 = (nh + nkv) * hd;
    AttentionArgs a;
    a.precision = backend::Precision::BF16;
    a.B = B; a.Tq = a.Tk = T; a.n_head = nh; a.n_kv_head = nkv; a.head_dim = hd;
    a.q_stride = a.kv_stride = QKV; a.q_batch_stride = a.kv_batch_stride = T * QKV;
    a.out_stride = A; a.out_batch_stride = T * A;
    std::vector<int32_t> starts(size_t(B) * T);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) starts[size_t(b) * T + t] = t < 20 ? 0 : 20;
    if (docs) {
      a.doc_start = starts.data();
      a.doc_batch_stride = T;
    }
    std::vector<float> qkv = normal(size_t(B) * T * QKV, 3 + docs);
    qkv[5] = 1e-39f;         // a denormal q element
    qkv[k0 + 3] = -2e-39f;   // and a k one
    const std::vector<uint16_t> qkv16 = cast(qkv);
    const std::vector<float> qkvw = widen(qkv16);
    std::vector<float> out(size_t(B) * T * A), lse(size_t(B) * nh * T);
    op.attention_forward(q, a, out.data(), lse.data(), qkvw.data(), qkvw.data() + k0,
                         qkvw.data() + v0);
    const std::vector<uint16_t> out16 = cast(out);
    const std::vector<float> outw = widen(out16), dout = normal(out.size(), 9);
    std::vector<float> want(qkv.size(), 0.0f), got(qkv.size(), 1.0f);
    op.attention_backward(q, a, want.data(), want.data() + k0, want.data() + v0, dout.data(),
                          qkvw.data(), qkvw.data() + k0, qkvw.data() + v0, outw.data(),
                          lse.data());
    AttentionArgs s = a;
    s.saved_bf16 = true;
    op.attention_backward(q, s, got.data(), got.data() + k0, got.data() + v0, dout.data(),
                          qkv16.data(), qkv16.data() + k0, qkv16.data() + v0, out16.data(),
                          lse.data());
    expect_bits(got, want, "dq|dk|dv");
    double norm = 0;
    for (float g : got) norm += double(g) * g;
    EXPECT_GT(norm, 0.0) << "no gradient";
  }
}
