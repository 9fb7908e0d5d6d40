// Tests of backend/cpu/attention: forward against a naive double-precision reference (materialised
// scores), backward against central finite differences, float against double, every code path the
// CPU supports against the others, and determinism across runs and thread counts.
//
// The benchmarks (gpt2-124m attention shapes; bf16 against fp32 also small's) are the disabled
// tests DISABLED_Benchmark.Gpt2Small and DISABLED_Benchmark.Bf16AgainstFp32:
//   OMP_NUM_THREADS=2 ./build/tests/test_attention --gtest_also_run_disabled_tests
//       --gtest_filter='*Benchmark*'
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tetrad/backend/cpu/attention.hpp"
#include "tetrad/backend/cpu/attention_bf16.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::kernels {
namespace {

std::vector<AttentionPath> supported_paths() {
  std::vector<AttentionPath> paths;
  for (AttentionPath p : {AttentionPath::kPortable, AttentionPath::kAvx2, AttentionPath::kAvx512})
    if (attention_path_supported(p)) paths.push_back(p);
  return paths;
}

// A problem laid out either as the model's fused qkv buffer [B, T, (nh + 2 nkv) hd] (fused=true,
// requires Tq == Tk) or as separate q [B, Tq, nh*hd] and k/v [B, Tk, nkv*hd] buffers with padded
// rows and batch gaps (like a KV cache with spare capacity).
struct Layout {
  AttentionDims d{};
  bool fused = false;
  int64_t q_off = 0, k_off = 0, v_off = 0;  // offsets in the `in` buffer
  int64_t in_size = 0, out_size = 0;
};

Layout make_layout(int B, int Tq, int Tk, int nh, int nkv, int hd, bool fused) {
  Layout L;
  L.fused = fused;
  AttentionDims& d = L.d;
  d.B = B, d.Tq = Tq, d.Tk = Tk, d.n_head = nh, d.n_kv_head = nkv, d.head_dim = hd;
  if (fused) {
    const int64_t width = int64_t(nh + 2 * nkv) * hd;
    d.q_stride = d.kv_stride = width;
    d.q_batch_stride = d.kv_batch_stride = width * Tq;
    L.q_off = 0, L.k_off = int64_t(nh) * hd, L.v_off = int64_t(nh + nkv) * hd;
    L.in_size = width * Tq * B;
  } else {
    d.q_stride = int64_t(nh) * hd + 3;
    d.kv_stride = int64_t(nkv) * hd + 5;
    d.q_batch_stride = d.q_stride * Tq + 7;
    d.kv_batch_stride = d.kv_stride * (Tk + 2);
    const int64_t q_size = d.q_batch_stride * B;
    const int64_t kv_size = d.kv_batch_stride * B;
    L.q_off = 0, L.k_off = q_size, L.v_off = q_size + kv_size;
    L.in_size = q_size + 2 * kv_size;
  }
  d.out_stride = int64_t(nh) * hd + 1;
  d.out_batch_stride = d.out_stride * Tq + 2;
  L.out_size = d.out_batch_stride * B;
  return L;
}

template <class T>
std::vector<T> random_vector(int64_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<T> x(n);
  for (auto& e : x) e = T(dist(rng));
  return x;
}

// Naive reference in double: out and lse (materialises each query row's scores). A query that
// sees no key (q_offset + i < 0): out 0, lse -inf.
constexpr int64_t kQueriesAtEnd = std::numeric_limits<int64_t>::min();  // q_offset = Tk - Tq
void reference_forward(std::vector<double>& out, std::vector<double>& lse,
                       const std::vector<double>& in, const Layout& L,
                       int64_t q_offset = kQueriesAtEnd) {
  const AttentionDims& d = L.d;
  const int hd = d.head_dim, group = d.n_head / d.n_kv_head;
  const int64_t off = q_offset == kQueriesAtEnd ? d.Tk - d.Tq : q_offset;
  out.assign(L.out_size, 0.0);
  lse.assign(int64_t(d.B) * d.n_head * d.Tq, 0.0);
  std::vector<double> s(d.Tk);
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.n_head; ++h)
      for (int i = 0; i < d.Tq; ++i) {
        const double* q = &in[L.q_off + b * d.q_batch_stride + i * d.q_stride + h * hd];
        const int nk = int(std::clamp<int64_t>(off + i + 1, 0, d.Tk));
        double m = -INFINITY;
        if (nk == 0) {
          lse[(int64_t(b) * d.n_head + h) * d.Tq + i] = -INFINITY;
          continue;
        }
        for (int j = 0; j < nk; ++j) {
          const double* k =
              &in[L.k_off + b * d.kv_batch_stride + j * d.kv_stride + (h / group) * hd];
          double dot = 0;
          for (int e = 0; e < hd; ++e) dot += q[e] * k[e];
          s[j] = dot / std::sqrt(double(hd));
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < nk; ++j) sum += std::exp(s[j] - m);
        lse[(int64_t(b) * d.n_head + h) * d.Tq + i] = m + std::log(sum);
        double* o = &out[b * d.out_batch_stride + i * d.out_stride + h * hd];
        for (int j = 0; j < nk; ++j) {
          const double p = std::exp(s[j] - m) / sum;
          const double* v =
              &in[L.v_off + b * d.kv_batch_stride + j * d.kv_stride + (h / group) * hd];
          for (int e = 0; e < hd; ++e) o[e] += p * v[e];
        }
      }
}

template <class T>
void run_forward(std::vector<T>& out, std::vector<T>& lse, const std::vector<T>& in,
                 const Layout& L, AttentionPath path) {
  out.assign(L.out_size, T(0));
  lse.assign(int64_t(L.d.B) * L.d.n_head * L.d.Tq, T(0));
  attention_forward(out.data(), lse.data(), in.data() + L.q_off, in.data() + L.k_off,
                    in.data() + L.v_off, L.d, path);
}

template <class T>
void run_backward(std::vector<T>& din, const std::vector<T>& dout, const std::vector<T>& in,
                  const std::vector<T>& out, const std::vector<T>& lse, const Layout& L,
                  AttentionPath path) {
  // NaN-filled: every element of dq/dk/dv must be overwritten (padding stays NaN, not compared).
  din.assign(L.in_size, std::numeric_limits<T>::quiet_NaN());
  attention_backward(din.data() + L.q_off, din.data() + L.k_off, din.data() + L.v_off, dout.data(),
                     in.data() + L.q_off, in.data() + L.k_off, in.data() + L.v_off, out.data(),
                     lse.data(), L.d, path);
}

// Calls f(offset) for every element of q, k, v (or of out when which == 'o') inside the layout.
template <class F>
void for_each_element(const Layout& L, char which, F f) {
  const AttentionDims& d = L.d;
  const int hd = d.head_dim;
  if (which == 'o') {
    for (int b = 0; b < d.B; ++b)
      for (int t = 0; t < d.Tq; ++t)
        for (int c = 0; c < d.n_head * hd; ++c) f(b * d.out_batch_stride + t * d.out_stride + c);
    return;
  }
  for (int b = 0; b < d.B; ++b) {
    for (int t = 0; t < d.Tq; ++t)
      for (int c = 0; c < d.n_head * hd; ++c)
        f(L.q_off + b * d.q_batch_stride + t * d.q_stride + c);
    for (int64_t base : {L.k_off, L.v_off})
      for (int t = 0; t < d.Tk; ++t)
        for (int c = 0; c < d.n_kv_head * hd; ++c)
          f(base + b * d.kv_batch_stride + t * d.kv_stride + c);
  }
}

// max |a - b| over the listed elements, divided by max |b| (b is the trusted one).
template <class A, class Bv>
double rel_error(const Layout& L, char which, const std::vector<A>& a, const std::vector<Bv>& b) {
  double diff = 0, ref = 0;
  for_each_element(L, which, [&](int64_t i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    ref = std::max(ref, std::abs(double(b[i])));
  });
  return ref > 0 ? diff / ref : diff;
}

// Largest absolute difference; an infinite reference (a row that sees no key: -inf) must be
// matched exactly, and a NaN is an infinite error.
template <class A, class Bv>
double lse_error(const std::vector<A>& a, const std::vector<Bv>& b) {
  double diff = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double x = double(a[i]), r = double(b[i]);
    const double e = x == r ? 0.0 : std::abs(x - r);
    diff = std::isnan(e) ? INFINITY : std::max(diff, e);
  }
  return diff;
}

struct Shape {
  int B, Tq, Tk, nh, nkv, hd;
  bool fused;
};

std::string describe(const Shape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "B=%d Tq=%d Tk=%d heads=%d/%d hd=%d %s", s.B, s.Tq, s.Tk, s.nh,
                s.nkv, s.hd, s.fused ? "fused qkv" : "separate buffers");
  return buf;
}

const std::vector<Shape> kForwardShapes = {
    {1, 1, 1, 1, 1, 8, true},     {2, 7, 7, 2, 2, 16, true},    {1, 64, 64, 2, 2, 64, true},
    {2, 65, 65, 3, 3, 32, true},  {1, 130, 130, 2, 2, 64, true}, {2, 130, 130, 4, 2, 24, true},
    {1, 67, 67, 4, 1, 5, true},   {2, 9, 9, 4, 2, 8, false},    {1, 1, 10, 4, 2, 16, false},
    {2, 3, 10, 4, 1, 16, false},  {1, 70, 200, 2, 1, 40, false}, {1, 129, 129, 1, 1, 128, false},
    {1, 200, 260, 6, 3, 64, false},
};

template <class T>
void check_forward_against_reference(double out_tol, double lse_tol) {
  for (const Shape& s : kForwardShapes) {
    const Layout L = make_layout(s.B, s.Tq, s.Tk, s.nh, s.nkv, s.hd, s.fused);
    const std::vector<double> in = random_vector<double>(L.in_size, 1234 + s.Tq * 7 + s.hd, 1.5);
    std::vector<double> ref_out, ref_lse;
    reference_forward(ref_out, ref_lse, in, L);
    const std::vector<T> in_t(in.begin(), in.end());
    for (AttentionPath path : supported_paths()) {
      SCOPED_TRACE(describe(s) + " path " + attention_path_name(path));
      std::vector<T> out, lse;
      run_forward(out, lse, in_t, L, path);
      EXPECT_LT(rel_error(L, 'o', out, ref_out), out_tol);
      EXPECT_LT(lse_error(lse, ref_lse), lse_tol);
    }
  }
}

// Errors seen: double about 2e-15, float about 1e-6 (out, relative) and 3e-6 (lse, absolute).
TEST(AttentionForward, DoubleMatchesReference) {
  check_forward_against_reference<double>(1e-12, 1e-12);
}
TEST(AttentionForward, FloatMatchesReference) {
  check_forward_against_reference<float>(2e-5, 2e-5);
}

TEST(AttentionForward, NullLseAndOutputPaddingUntouched) {
  const Layout L = make_layout(2, 33, 40, 4, 2, 16, false);
  const std::vector<float> in = random_vector<float>(L.in_size, 7);
  std::vector<float> out_ref, lse;
  run_forward(out_ref, lse, in, L, attention_default_path());
  std::vector<float> out(L.out_size, -7.0f);
  attention_forward<float>(out.data(), nullptr, in.data() + L.q_off, in.data() + L.k_off,
                           in.data() + L.v_off, L.d);
  int64_t checked = 0;
  for_each_element(L, 'o', [&](int64_t i) {
    EXPECT_EQ(out[i], out_ref[i]);
    out[i] = -7.0f;
    ++checked;
  });
  EXPECT_GT(checked, 0);
  for (float x : out) ASSERT_EQ(x, -7.0f) << "forward wrote outside its rows";
}

// No queries: forward writes nothing, backward gives zero dk/dv (with several key chunks).
TEST(Attention, NoQueries) {
  const Layout L = make_layout(1, 0, 200, 2, 1, 8, false);
  const std::vector<float> in = random_vector<float>(L.in_size, 41);
  std::vector<float> out, lse, din;
  run_forward(out, lse, in, L, attention_default_path());
  run_backward(din, out, in, out, lse, L, attention_default_path());
  for_each_element(L, 'i', [&](int64_t i) {
    if (i >= L.k_off) {
      ASSERT_EQ(din[i], 0.0f);
    }
  });
}

// Backward against central differences of L = sum(out * R), double precision, every element.
void check_backward_finite_differences(const Shape& s, AttentionPath path) {
  SCOPED_TRACE(describe(s) + " path " + attention_path_name(path));
  const Layout L = make_layout(s.B, s.Tq, s.Tk, s.nh, s.nkv, s.hd, s.fused);
  std::vector<double> in = random_vector<double>(L.in_size, 99 + s.Tq + 31 * s.nkv + s.hd);
  const std::vector<double> R = random_vector<double>(L.out_size, 5 + s.Tk);
  std::vector<double> out, lse, din;
  run_forward(out, lse, in, L, path);
  run_backward(din, R, in, out, lse, L, path);

  auto loss = [&](const std::vector<double>& x) {
    std::vector<double> o, l;
    run_forward(o, l, x, L, path);
    double sum = 0;
    for_each_element(L, 'o', [&](int64_t i) { sum += o[i] * R[i]; });
    return sum;
  };
  // The perturbed forwards run on one thread: they are tiny, and thread hand-offs would dominate
  // on a loaded machine (the Deterministic test shows thread counts give identical results).
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<double> fd(L.in_size, 0.0);
  const double eps = 1e-5;
  for_each_element(L, 'i', [&](int64_t i) {
    const double x0 = in[i];
    in[i] = x0 + eps;
    const double lp = loss(in);
    in[i] = x0 - eps;
    const double lm = loss(in);
    in[i] = x0;
    fd[i] = (lp - lm) / (2 * eps);
  });
  omp_set_num_threads(saved_threads);
  EXPECT_LT(rel_error(L, 'i', din, fd), 1e-6);
}

TEST(AttentionBackward, MatchesFiniteDifferences) {
  const std::vector<Shape> shapes = {
      {2, 5, 5, 2, 2, 4, true},  {2, 7, 7, 2, 1, 6, true},   {2, 9, 9, 2, 2, 8, true},
      {2, 6, 6, 4, 2, 5, true},  {2, 3, 7, 2, 1, 8, false},  {1, 8, 8, 2, 2, 7, false},
  };
  for (const Shape& s : shapes)
    for (AttentionPath path : supported_paths()) check_backward_finite_differences(s, path);
}

// Beyond one key block (64 keys): several query and key blocks, and the backward split into key
// chunks whose dq shares are summed (one sequence with one kv head gives too few tasks otherwise).
TEST(AttentionBackward, MatchesFiniteDifferencesAcrossBlocks) {
  const std::vector<Shape> shapes = {{1, 70, 70, 2, 1, 3, true}, {1, 20, 130, 1, 1, 2, false}};
  for (const Shape& s : shapes)
    for (AttentionPath path : supported_paths()) check_backward_finite_differences(s, path);
}

// Float and double runs of the same problem agree (forward and backward) on a multi-block shape.
TEST(Attention, FloatMatchesDouble) {
  for (bool gqa : {false, true}) {
    const Layout L = make_layout(2, 130, 130, 4, gqa ? 2 : 4, 64, true);
    const std::vector<double> in = random_vector<double>(L.in_size, 11);
    const std::vector<double> R = random_vector<double>(L.out_size, 12);
    const std::vector<float> in_f(in.begin(), in.end());
    const std::vector<float> R_f(R.begin(), R.end());
    std::vector<double> out, lse, din;
    run_forward(out, lse, in, L, attention_default_path());
    run_backward(din, R, in, out, lse, L, attention_default_path());
    for (AttentionPath path : supported_paths()) {
      SCOPED_TRACE(std::string(gqa ? "gqa " : "mha ") + attention_path_name(path));
      std::vector<float> out_f, lse_f, din_f;
      run_forward(out_f, lse_f, in_f, L, path);
      run_backward(din_f, R_f, in_f, out_f, lse_f, L, path);
      EXPECT_LT(rel_error(L, 'o', out_f, out), 1e-5);
      EXPECT_LT(lse_error(lse_f, lse), 1e-5);
      EXPECT_LT(rel_error(L, 'i', din_f, din), 1e-5);
    }
  }
}

// Code paths agree with each other in double (to rounding).
TEST(Attention, PathsAgree) {
  const Layout L = make_layout(2, 100, 150, 4, 2, 24, false);
  const std::vector<double> in = random_vector<double>(L.in_size, 21);
  const std::vector<double> R = random_vector<double>(L.out_size, 22);
  std::vector<double> out0, lse0, din0;
  run_forward(out0, lse0, in, L, AttentionPath::kPortable);
  run_backward(din0, R, in, out0, lse0, L, AttentionPath::kPortable);
  for (AttentionPath path : supported_paths()) {
    SCOPED_TRACE(attention_path_name(path));
    std::vector<double> out, lse, din;
    run_forward(out, lse, in, L, path);
    run_backward(din, R, in, out, lse, L, path);
    EXPECT_LT(rel_error(L, 'o', out, out0), 1e-13);
    EXPECT_LT(rel_error(L, 'i', din, din0), 1e-12);
  }
}

// Any query offset (query i at key position q_offset + i): 0 with Tq < Tk and Tq > Tk, inside the
// key block off the block grid, the training case, after the whole key block (padded keys of
// the last block then precede the queries), and negative (queries before part or all of the key
// block, a key block of context parallelism: those rows see nothing, out 0 and lse -inf, dq 0),
// GQA, across 64-row blocks: every path's forward
// against the double reference and its backward against the portable path's (the default path's
// backward is checked against finite differences in test_backend_conformance).
TEST(Attention, KeyOffsetEveryPath) {
  struct Case { int Tq, Tk; int64_t off; };
  const Case cases[] = {{40, 150, 0},   {150, 40, 0},   {70, 150, 37},  {70, 150, 80},
                        {30, 100, 130}, {70, 150, -30}, {100, 40, -70}, {30, 100, -40}};
  for (const Case& c : cases) {
    const Layout L = make_layout(2, c.Tq, c.Tk, 4, 2, 24, false);
    const std::vector<double> in = random_vector<double>(L.in_size, 41);
    const std::vector<double> R = random_vector<double>(L.out_size, 42);
    std::vector<double> ref_out, ref_lse;
    reference_forward(ref_out, ref_lse, in, L, c.off);
    std::vector<double> din0;
    for (AttentionPath path : supported_paths()) {
      SCOPED_TRACE(std::string(attention_path_name(path)) + " Tq " + std::to_string(c.Tq) +
                   " Tk " + std::to_string(c.Tk) + " q_offset " + std::to_string(c.off));
      std::vector<double> out(L.out_size, 0.0), lse(int64_t(2) * 4 * c.Tq, 0.0),
          din(L.in_size, std::numeric_limits<double>::quiet_NaN());  // all must be written
      attention_forward(out.data(), lse.data(), in.data() + L.q_off, in.data() + L.k_off,
                        in.data() + L.v_off, L.d, c.off, path);
      EXPECT_LT(rel_error(L, 'o', out, ref_out), 1e-12);
      EXPECT_LT(lse_error(lse, ref_lse), 1e-12);
      attention_backward(din.data() + L.q_off, din.data() + L.k_off, din.data() + L.v_off,
                         R.data(), in.data() + L.q_off, in.data() + L.k_off, in.data() + L.v_off,
                         out.data(), lse.data(), L.d, c.off, path);
      if (din0.empty()) din0 = din;
      else EXPECT_LT(rel_error(L, 'i', din, din0), 1e-12);
    }
  }
  // The training overloads are the q_offset = Tk - Tq case, bit for bit.
  const Layout L = make_layout(1, 70, 150, 4, 2, 24, false);
  const std::vector<float> in = random_vector<float>(L.in_size, 43);
  std::vector<float> a, la, b(L.out_size, 0.0f), lb(4 * 70, 0.0f);
  run_forward(a, la, in, L, attention_default_path());
  attention_forward(b.data(), lb.data(), in.data() + L.q_off, in.data() + L.k_off,
                    in.data() + L.v_off, L.d, int64_t(80));
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
  EXPECT_THROW(attention_forward(b.data(), lb.data(), in.data() + L.q_off, in.data() + L.k_off,
                                 in.data() + L.v_off, L.d, int64_t(1) << 40),
               Error);  // past the kernel's int positions
}

// Two runs are bit-identical, and so are runs with 1 and 2 threads.
TEST(Attention, Deterministic) {
  const Layout L = make_layout(2, 150, 150, 4, 2, 64, true);
  const std::vector<float> in = random_vector<float>(L.in_size, 31);
  const std::vector<float> R = random_vector<float>(L.out_size, 32);
  for (AttentionPath path : supported_paths()) {
    SCOPED_TRACE(attention_path_name(path));
    std::vector<float> out[3], lse[3], din[3];
    const int saved = omp_get_max_threads();
    for (int run = 0; run < 3; ++run) {
      omp_set_num_threads(run == 2 ? 1 : 2);
      run_forward(out[run], lse[run], in, L, path);
      run_backward(din[run], R, in, out[run], lse[run], L, path);
    }
    omp_set_num_threads(saved);
    for (int run = 1; run < 3; ++run) {
      EXPECT_EQ(0, std::memcmp(out[0].data(), out[run].data(), out[0].size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(lse[0].data(), lse[run].data(), lse[0].size() * sizeof(float)));
      // din's padding is NaN in every run, memcmp compares bit patterns so NaN == NaN here.
      EXPECT_EQ(0, std::memcmp(din[0].data(), din[run].data(), din[0].size() * sizeof(float)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// bf16 products (attention_bf16.hpp): every path the CPU supports, forced one by one, against the
// double reference (forward) and the double kernel's backward (itself checked against finite
// differences above), within bf16 tolerances and demonstrably rounded; outputs poisoned with NaN
// first; q_offset beyond Tk - Tq against finite differences; bit-identical across runs and thread
// counts.

std::vector<AttentionBf16Path> supported_bf16_paths() {
  std::vector<AttentionBf16Path> paths;
  for (AttentionBf16Path p : {AttentionBf16Path::kEmulated, AttentionBf16Path::kEmulatedAvx2,
                              AttentionBf16Path::kAvx512Bf16, AttentionBf16Path::kAmx})
    if (attention_bf16_path_supported(p)) paths.push_back(p);
  return paths;
}

void run_forward_bf16(std::vector<float>& out, std::vector<float>& lse, const std::vector<float>& in,
                      const Layout& L, int64_t q_offset, AttentionBf16Path path) {
  out.assign(L.out_size, std::numeric_limits<float>::quiet_NaN());
  lse.assign(int64_t(L.d.B) * L.d.n_head * L.d.Tq, std::numeric_limits<float>::quiet_NaN());
  attention_forward_bf16(out.data(), lse.data(), in.data() + L.q_off, in.data() + L.k_off,
                         in.data() + L.v_off, L.d, q_offset, path);
}
void run_backward_bf16(std::vector<float>& din, const std::vector<float>& dout,
                       const std::vector<float>& in, const std::vector<float>& out,
                       const std::vector<float>& lse, const Layout& L, int64_t q_offset,
                       AttentionBf16Path path) {
  din.assign(L.in_size, std::numeric_limits<float>::quiet_NaN());
  attention_backward_bf16(din.data() + L.q_off, din.data() + L.k_off, din.data() + L.v_off,
                          dout.data(), in.data() + L.q_off, in.data() + L.k_off,
                          in.data() + L.v_off, out.data(), lse.data(), L.d, q_offset, path);
}

// Every listed element is finite (the NaN poison was overwritten, and nothing overflowed).
bool all_finite(const Layout& L, char which, const std::vector<float>& x) {
  bool ok = true;
  for_each_element(L, which, [&](int64_t i) { ok = ok && std::isfinite(x[i]); });
  return ok;
}

TEST(AttentionBf16, EveryPathAgainstDoubleWithinBf16Tolerance) {
  // Across the kernel's 32-row blocks (tails), GQA, several sequences, decode-like Tq < Tk, head
  // sizes that are not multiples of 32, one kv head of one sequence (a single backward task), and
  // more keys than one chunk of the backward.
  const std::vector<Shape> shapes = {
      {1, 1, 1, 1, 1, 8, true},      {2, 7, 7, 2, 2, 16, true},    {1, 64, 64, 2, 2, 64, true},
      {2, 65, 65, 3, 3, 32, true},   {2, 130, 130, 4, 2, 24, true}, {1, 67, 67, 4, 1, 5, true},
      {1, 1, 10, 4, 2, 16, false},   {2, 3, 40, 4, 1, 16, false},  {1, 70, 200, 2, 1, 40, false},
      {1, 129, 129, 1, 1, 128, false}, {1, 300, 300, 2, 1, 64, true},
      // more keys than the backward's 512-key chunk (dQ accumulated over chunks)
      {1, 600, 600, 2, 1, 16, true},  {1, 40, 1100, 4, 2, 24, false},
  };
  constexpr double kLo = 1e-5, kHi = 2e-2;  // the rounding shows, and stays at bf16 size
  for (const Shape& s : shapes) {
    const Layout L = make_layout(s.B, s.Tq, s.Tk, s.nh, s.nkv, s.hd, s.fused);
    const std::vector<double> in = random_vector<double>(L.in_size, 4321 + s.Tq * 7 + s.hd, 1.5);
    const std::vector<double> R = random_vector<double>(L.out_size, 17 + s.Tk);
    std::vector<double> ref_out, ref_lse, ref_din;
    reference_forward(ref_out, ref_lse, in, L);
    run_backward(ref_din, R, in, ref_out, ref_lse, L, attention_default_path());
    const std::vector<float> in_f(in.begin(), in.end()), R_f(R.begin(), R.end());
    for (AttentionBf16Path path : supported_bf16_paths()) {
      SCOPED_TRACE(describe(s) + " bf16 path " + attention_bf16_path_name(path));
      std::vector<float> out, lse, din;
      run_forward_bf16(out, lse, in_f, L, s.Tk - s.Tq, path);
      ASSERT_TRUE(all_finite(L, 'o', out));
      for (float x : lse) ASSERT_TRUE(std::isfinite(x));
      const double e_out = rel_error(L, 'o', out, ref_out);
      EXPECT_LT(e_out, kHi);
      if (s.Tk > 1) {
        EXPECT_GT(e_out, kLo) << "no bf16 rounding visible";
      }
      // lse: relative to the largest |lse| (a score's rounding error grows with the score).
      double lse_scale = 1;
      for (double x : ref_lse) lse_scale = std::max(lse_scale, std::abs(x));
      EXPECT_LT(lse_error(lse, ref_lse) / lse_scale, kHi);
      run_backward_bf16(din, R_f, in_f, out, lse, L, s.Tk - s.Tq, path);
      ASSERT_TRUE(all_finite(L, 'i', din));
      const double e_din = rel_error(L, 'i', din, ref_din);
      EXPECT_LT(e_din, kHi);
      EXPECT_GT(e_din, kLo) << "no bf16 rounding visible";
    }
  }
}

// Queries after (part of) their key block (q_offset > Tk - Tq, context parallelism's case): the
// forward against a double reference with that offset, the backward against its finite
// differences.
TEST(AttentionBf16, KeyOffsetAgainstFiniteDifferences) {
  const Layout L = make_layout(2, 5, 40, 4, 2, 16, false);
  const int64_t off = 45;  // every query sees all 40 keys
  const std::vector<double> in = random_vector<double>(L.in_size, 77, 1.0);
  const std::vector<double> R = random_vector<double>(L.out_size, 78);
  // With off >= Tk every query sees every key: the reference is the full (unmasked) softmax,
  // which the causal reference gives for a layout whose queries sit at the end of Tk + Tq keys.
  auto ref_loss = [&](const std::vector<double>& x, std::vector<double>* out_ref) {
    const AttentionDims& d = L.d;
    std::vector<double> o(L.out_size, 0.0);
    const int hd = d.head_dim, group = d.n_head / d.n_kv_head;
    double loss = 0;
    for (int b = 0; b < d.B; ++b)
      for (int h = 0; h < d.n_head; ++h)
        for (int i = 0; i < d.Tq; ++i) {
          const double* q = &x[L.q_off + b * d.q_batch_stride + i * d.q_stride + h * hd];
          const int nk = int(std::min<int64_t>(d.Tk, off + i + 1));
          std::vector<double> sc(nk);
          double m = -INFINITY, sum = 0;
          for (int j = 0; j < nk; ++j) {
            const double* k = &x[L.k_off + b * d.kv_batch_stride + j * d.kv_stride + (h / group) * hd];
            double dot = 0;
            for (int e = 0; e < hd; ++e) dot += q[e] * k[e];
            sc[j] = dot / std::sqrt(double(hd));
            m = std::max(m, sc[j]);
          }
          for (int j = 0; j < nk; ++j) sum += std::exp(sc[j] - m);
          double* orow = &o[b * d.out_batch_stride + i * d.out_stride + h * hd];
          for (int j = 0; j < nk; ++j) {
            const double* v = &x[L.v_off + b * d.kv_batch_stride + j * d.kv_stride + (h / group) * hd];
            for (int e = 0; e < hd; ++e) orow[e] += std::exp(sc[j] - m) / sum * v[e];
          }
        }
    for_each_element(L, 'o', [&](int64_t i) { loss += o[i] * R[i]; });
    if (out_ref) *out_ref = o;
    return loss;
  };
  std::vector<double> ref_out;
  ref_loss(in, &ref_out);
  std::vector<double> x = in, fd(L.in_size, 0.0);
  const double eps = 1e-5;
  for_each_element(L, 'i', [&](int64_t i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = ref_loss(x, nullptr);
    x[i] = x0 - eps;
    const double lm = ref_loss(x, nullptr);
    x[i] = x0;
    fd[i] = (lp - lm) / (2 * eps);
  });
  const std::vector<float> in_f(in.begin(), in.end()), R_f(R.begin(), R.end());
  for (AttentionBf16Path path : supported_bf16_paths()) {
    SCOPED_TRACE(std::string("bf16 path ") + attention_bf16_path_name(path));
    std::vector<float> out, lse, din;
    run_forward_bf16(out, lse, in_f, L, off, path);
    EXPECT_LT(rel_error(L, 'o', out, ref_out), 2e-2);
    run_backward_bf16(din, R_f, in_f, out, lse, L, off, path);
    ASSERT_TRUE(all_finite(L, 'i', din));
    EXPECT_LT(rel_error(L, 'i', din, fd), 2e-2);
  }
}

// Bit-identical between runs and for 1 and 2 threads, on every path; the paths differ from each
// other only by summation order (within bf16 rounding of the product inputs: far below kHi).
TEST(AttentionBf16, DeterministicAcrossRunsAndThreadCounts) {
  const Layout L = make_layout(2, 150, 150, 4, 2, 64, true);
  const std::vector<float> in = random_vector<float>(L.in_size, 31);
  const std::vector<float> R = random_vector<float>(L.out_size, 32);
  std::vector<float> first_out;
  for (AttentionBf16Path path : supported_bf16_paths()) {
    SCOPED_TRACE(attention_bf16_path_name(path));
    std::vector<float> out[3], lse[3], din[3];
    const int saved = omp_get_max_threads();
    for (int run = 0; run < 3; ++run) {
      omp_set_num_threads(run == 2 ? 1 : 2);
      run_forward_bf16(out[run], lse[run], in, L, 0, path);
      run_backward_bf16(din[run], R, in, out[run], lse[run], L, 0, path);
    }
    omp_set_num_threads(saved);
    for (int run = 1; run < 3; ++run) {
      EXPECT_EQ(0, std::memcmp(out[0].data(), out[run].data(), out[0].size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(lse[0].data(), lse[run].data(), lse[0].size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(din[0].data(), din[run].data(), din[0].size() * sizeof(float)));
    }
    if (first_out.empty()) first_out = out[0];
    else EXPECT_LT(rel_error(L, 'o', out[0], first_out), 1e-5);
  }
}

// A head's results do not depend on what else the call holds: the first sequence's first kv
// group alone (fewer heads, one sequence, same strides) gives bit for bit what the whole call gives
// for it, forward and backward (what lets grids that split heads over Y or the batch over D match
// one rank).
TEST(AttentionBf16, HeadsAndSequencesAreIndependentOfTheRestOfTheCall) {
  const Layout L = make_layout(2, 100, 100, 4, 2, 64, false);
  const std::vector<float> in = random_vector<float>(L.in_size, 51);
  const std::vector<float> R = random_vector<float>(L.out_size, 52);
  Layout S = L;
  S.d.B = 1, S.d.n_head = 2, S.d.n_kv_head = 1;
  for (AttentionBf16Path path : supported_bf16_paths()) {
    SCOPED_TRACE(attention_bf16_path_name(path));
    std::vector<float> out, lse, din, out_s, lse_s, din_s;
    run_forward_bf16(out, lse, in, L, 0, path);
    run_backward_bf16(din, R, in, out, lse, L, 0, path);
    run_forward_bf16(out_s, lse_s, in, S, 0, path);
    // lse of the sub-call is [1][2][T]: the first two heads' rows of the whole call's.
    run_backward_bf16(din_s, R, in, out_s, lse_s, S, 0, path);
    int64_t checked = 0;
    for_each_element(S, 'o', [&](int64_t i) {
      ASSERT_EQ(std::memcmp(&out[i], &out_s[i], sizeof(float)), 0) << "out element " << i;
      ++checked;
    });
    for_each_element(S, 'i', [&](int64_t i) {
      ASSERT_EQ(std::memcmp(&din[i], &din_s[i], sizeof(float)), 0) << "gradient element " << i;
      ++checked;
    });
    EXPECT_EQ(0, std::memcmp(lse.data(), lse_s.data(), sizeof(float) * 2 * L.d.Tq));
    EXPECT_GT(checked, 0);
  }
}

TEST(AttentionBf16, UnsupportedPathIsRefused) {
  const Layout L = make_layout(1, 4, 4, 1, 1, 8, true);
  const std::vector<float> in = random_vector<float>(L.in_size, 3);
  for (AttentionBf16Path p : {AttentionBf16Path::kEmulatedAvx2, AttentionBf16Path::kAvx512Bf16,
                              AttentionBf16Path::kAmx})
    if (!attention_bf16_path_supported(p)) {
      std::vector<float> out, lse;
      EXPECT_THROW(run_forward_bf16(out, lse, in, L, 0, p), Error) << attention_bf16_path_name(p);
    }
  // The default is the widest supported path (or an emulated one where bf16 GEMMs are).
  EXPECT_TRUE(attention_bf16_path_supported(attention_bf16_default_path()));
}

// ---------------------------------------------------------------------------------------------
// Benchmark: gpt2-124m attention (B=1, T=1024, 12 heads, hd=64), float, fused qkv layout.

typedef float v8f __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));

// Register-only FMA loop: FLOP/s of one thread at the widest supported vector width.
template <class V>
__attribute__((always_inline)) inline double fma_loop(int64_t iters) {
  V a[12], x = {}, y = {};
  x += 1.0000001f, y += 0.9999999f;
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) a[i] = V{} + float(i);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = a[i] * x + y;  // 12 independent chains
  double s = 0;
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) s += a[i][0];
  return s;
}
__attribute__((target("avx512f,fma"))) double fma_avx512(int64_t n) { return fma_loop<v16f>(n); }
__attribute__((target("avx2,fma"))) double fma_avx2(int64_t n) { return fma_loop<v8f>(n); }

double measure_fma_peak(int threads) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const int lanes = avx512 ? 16 : 8;
  const int64_t iters = 20'000'000;
  double sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += avx512 ? fma_avx512(iters) : fma_avx2(iters);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sink == 42) std::printf(" ");
  return 2.0 * 12 * lanes * iters * threads / sec;
}

TEST(DISABLED_Benchmark, Gpt2Small) {
  const int threads = omp_get_max_threads();
  const Layout L = make_layout(1, 1024, 1024, 12, 12, 64, true);
  const std::vector<float> in = random_vector<float>(L.in_size, 1);
  const std::vector<float> R = random_vector<float>(L.out_size, 2);
  std::vector<float> out(L.out_size), lse(12 * 1024), din(L.in_size);
  const double fwd_flop = attention_forward_flops(L.d), bwd_flop = 2.5 * fwd_flop;
  const double peak = measure_fma_peak(threads);
  std::printf("threads %d, FMA peak %.0f GFLOP/s (register-only loop, %s)\n", threads, peak / 1e9,
              __builtin_cpu_supports("avx512f") ? "avx512" : "avx2");
  for (AttentionPath path : supported_paths()) {
    auto time = [&](auto fn) {
      fn();  // warm-up
      std::vector<double> t;
      for (int rep = 0; rep < 7; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    const double tf = time([&] {
      attention_forward(out.data(), lse.data(), in.data() + L.q_off, in.data() + L.k_off,
                        in.data() + L.v_off, L.d, path);
    });
    const double tb = time([&] {
      attention_backward(din.data() + L.q_off, din.data() + L.k_off, din.data() + L.v_off,
                         R.data(), in.data() + L.q_off, in.data() + L.k_off, in.data() + L.v_off,
                         out.data(), lse.data(), L.d, path);
    });
    std::printf(
        "%-9s B=1 T=1024 heads=12 hd=64: forward %.2f ms %.1f GFLOP/s (%.0f%% of peak), "
        "backward %.2f ms %.1f GFLOP/s (%.0f%% of peak)\n",
        attention_path_name(path), tf * 1e3, fwd_flop / tf / 1e9, 100 * fwd_flop / tf / peak,
        tb * 1e3, bwd_flop / tb / 1e9, 100 * bwd_flop / tb / peak);
  }
}

// bf16 attention against the fp32 kernel, gpt2-124m's (B=1, T=1024, 12 heads, hd 64) and small's
// (B=4, T=512, 8 heads) shapes, fused qkv layout: every supported bf16 path and the fp32 default
// path in interleaved rounds, medians of wall time and of the process's CPU time (on a shared
// machine the CPU time is the steadier one).
TEST(DISABLED_Benchmark, Bf16AgainstFp32) {
  struct Case { const char* name; int B, T, H; };
  for (const Case& cs : {Case{"gpt2-124m", 1, 1024, 12}, Case{"small", 4, 512, 8}}) {
    const Layout L = make_layout(cs.B, cs.T, cs.T, cs.H, cs.H, 64, true);
    const std::vector<float> in = random_vector<float>(L.in_size, 1);
    const std::vector<float> R = random_vector<float>(L.out_size, 2);
    std::vector<float> out(L.out_size), lse(int64_t(cs.B) * cs.H * cs.T), din(L.in_size);
    const float *q = in.data() + L.q_off, *k = in.data() + L.k_off, *v = in.data() + L.v_off;
    float *dq = din.data() + L.q_off, *dk = din.data() + L.k_off, *dv = din.data() + L.v_off;
    struct Kernel {
      std::string name;
      std::function<void()> fwd, bwd;
      std::vector<double> tf, tb, cf, cb;
    };
    std::vector<Kernel> ks;
    ks.push_back({"fp32 " + std::string(attention_path_name(attention_default_path())),
                  [&] { attention_forward(out.data(), lse.data(), q, k, v, L.d); },
                  [&] { attention_backward(dq, dk, dv, R.data(), q, k, v, out.data(), lse.data(), L.d); },
                  {}, {}, {}, {}});
    for (AttentionBf16Path p : supported_bf16_paths())
      ks.push_back({std::string("bf16 ") + attention_bf16_path_name(p),
                    [&, p] { attention_forward_bf16(out.data(), lse.data(), q, k, v, L.d, 0, p); },
                    [&, p] {
                      attention_backward_bf16(dq, dk, dv, R.data(), q, k, v, out.data(),
                                              lse.data(), L.d, 0, p);
                    },
                    {}, {}, {}, {}});
    auto wall = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
    auto cpu = [] { return double(std::clock()) / CLOCKS_PER_SEC; };
    for (Kernel& x : ks) x.fwd(), x.bwd();  // warm-up (arenas, pages)
    for (int round = 0; round < 7; ++round)
      for (Kernel& x : ks) {
        const double w0 = wall(), c0 = cpu();
        x.fwd();
        const double w1 = wall(), c1 = cpu();
        x.bwd();
        const double w2 = wall(), c2 = cpu();
        x.tf.push_back(w1 - w0), x.tb.push_back(w2 - w1), x.cf.push_back(c1 - c0), x.cb.push_back(c2 - c1);
      }
    auto med = [](std::vector<double> t) {
      std::sort(t.begin(), t.end());
      return t[t.size() / 2] * 1e3;
    };
    std::printf("%s (B=%d T=%d heads=%d hd=64), %d threads, ms per call, medians of 7 interleaved "
                "rounds: wall (CPU time)\n", cs.name, cs.B, cs.T, cs.H, omp_get_max_threads());
    for (const Kernel& x : ks)
      std::printf("  %-20s forward %7.2f (%7.2f) x%.2f   backward %7.2f (%7.2f) x%.2f\n",
                  x.name.c_str(), med(x.tf), med(x.cf), med(ks[0].cf) / med(x.cf), med(x.tb),
                  med(x.cb), med(ks[0].cb) / med(x.cb));
  }
}

// The default bf16 path alone on gpt2-124m's shape (B=1, T=1024, 12 heads, hd 64; and small's,
// B=4, T=512, 8 heads), fused qkv layout: ms per call and GFLOP/s, forward and backward, medians
// of TETRAD_BENCH_ROUNDS rounds (default 15) of wall time and of the process's CPU time. FLOPs:
// attention_forward_flops (the causal QKᵀ and PV, 4·T²/2·hd·heads), the backward 2.5x that (five
// products of the same size). The one to run under perf: no other kernel runs beside it.
TEST(DISABLED_Benchmark, Bf16DefaultPath) {
  const char* env = std::getenv("TETRAD_BENCH_ROUNDS");
  const int rounds = env ? std::max(1, std::atoi(env)) : 15;
  const AttentionBf16Path p = attention_bf16_default_path();
  struct Case { const char* name; int B, T, H; };
  for (const Case& cs : {Case{"gpt2-124m", 1, 1024, 12}, Case{"small", 4, 512, 8}}) {
    const Layout L = make_layout(cs.B, cs.T, cs.T, cs.H, cs.H, 64, true);
    const std::vector<float> in = random_vector<float>(L.in_size, 1);
    const std::vector<float> R = random_vector<float>(L.out_size, 2);
    std::vector<float> out(L.out_size), lse(int64_t(cs.B) * cs.H * cs.T), din(L.in_size);
    const float *q = in.data() + L.q_off, *k = in.data() + L.k_off, *v = in.data() + L.v_off;
    float *dq = din.data() + L.q_off, *dk = din.data() + L.k_off, *dv = din.data() + L.v_off;
    auto wall = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
    auto cpu = [] { return double(std::clock()) / CLOCKS_PER_SEC; };
    auto fwd = [&] { attention_forward_bf16(out.data(), lse.data(), q, k, v, L.d, 0, p); };
    auto bwd = [&] {
      attention_backward_bf16(dq, dk, dv, R.data(), q, k, v, out.data(), lse.data(), L.d, 0, p);
    };
    fwd(), bwd();  // warm-up (arenas, pages)
    std::vector<double> tf, tb, cf, cb;
    for (int round = 0; round < rounds; ++round) {
      const double w0 = wall(), c0 = cpu();
      fwd();
      const double w1 = wall(), c1 = cpu();
      bwd();
      const double w2 = wall(), c2 = cpu();
      tf.push_back(w1 - w0), tb.push_back(w2 - w1), cf.push_back(c1 - c0), cb.push_back(c2 - c1);
    }
    auto med = [](std::vector<double> t) {
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    const double ff = attention_forward_flops(L.d), fb = 2.5 * ff;
    const int th = omp_get_max_threads();
    std::printf("%s (B=%d T=%d heads=%d hd=64) bf16 %s, %d threads, medians of %d rounds: "
                "forward %.2f ms wall %.0f GFLOP/s, %.2f ms CPU %.0f GFLOP/s per thread; "
                "backward %.2f ms wall %.0f GFLOP/s, %.2f ms CPU %.0f GFLOP/s per thread\n",
                cs.name, cs.B, cs.T, cs.H, attention_bf16_path_name(p), th, rounds,
                med(tf) * 1e3, ff / med(tf) / 1e9, med(cf) * 1e3, ff / med(cf) / 1e9,
                med(tb) * 1e3, fb / med(tb) / 1e9, med(cb) * 1e3, fb / med(cb) / 1e9);
    EXPECT_TRUE(std::isfinite(out[0]) && std::isfinite(din[0]));
  }
}

}  // namespace
}  // namespace tetrad::kernels
