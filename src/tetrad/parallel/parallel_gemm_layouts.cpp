// ParallelTransformer: the per-site GEMM layout plan (gemm_layouts.hpp) — the rule, the
// start-up tuning on this rank's shapes (AxoNN's method) and given or checkpointed plans.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "tetrad/backend/bf16.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/activation_layout.hpp"
#include "tetrad/parallel/parallel_ops.hpp"

namespace tetrad::parallel {

GemmLayoutPlan ParallelTransformer::rule_gemm_layouts() const {
  GemmLayoutPlan p;
  p.source = "rule";
  const int64_t N = int64_t(local_batch_) * local_len_;

  for (int i = 0; i < kGemmSites; ++i) {
    GemmSiteLayout& s = p.site[size_t(i)];
    s.N = N, s.k_in = ctx_.dims.*kLinears[i].in, s.n_out = ctx_.dims.*kLinears[i].out;
    s.fwd = {};
    s.dx = {false, false};       // dY16 · W
    s.dw = {!wgrad_nn_, false};  // NN on dY16ᵀ where the cast-transpose runs, else TN on dY
  }
  return p;
}

void ParallelTransformer::check_gemm_layout_plan(const GemmLayoutPlan& plan) const {
  const bool can_dyt = bf16_acts_ && ctx_.be->capabilities().bf16_producers;
  const bool can_tr = precision_ == backend::Precision::BF16 &&
                      ctx_.be->capabilities().gemm_product_forms;
  for (int i = 0; i < kGemmSites; ++i) {
    const GemmSiteLayout& s = plan.site[size_t(i)];
    const std::string site = kGemmSiteNames[size_t(i)];
    if ((s.dx.ta || !s.dw.ta) && !can_dyt)
      fail("gemm layout plan: ", site, ".", s.dx.ta ? "dx = TN" : "dw = NN",
           " reads the transposed bf16 copy of dY, which needs precision bf16 with bf16 "
           "activations on a backend with cast_transpose_f32_to_bf16 (Capabilities::"
           "bf16_producers); here use dx NN and dw TN");
    if ((s.fwd.transposed || s.dx.transposed || s.dw.transposed) && !can_tr)
      fail("gemm layout plan: ", site, " computes a product transposed (\"/tr\"), which needs "
           "bf16 GEMMs on a backend that honours GemmArgs::product (the CPU); backend '",
           ctx_.be->name(), "' with precision ", precision_ == backend::Precision::BF16 ? "bf16" : "fp32");
  }
}

bool ParallelTransformer::set_gemm_layout_plan(const GemmLayoutPlan& plan) {
  const GemmLayoutPlan rule = rule_gemm_layouts();
  if (!plan.same_shapes(rule)) return false;
  check_gemm_layout_plan(plan);
  GemmLayoutPlan p = plan;
  for (int i = 0; i < kGemmSites; ++i) {  // "*" sizes take this model's
    p.site[size_t(i)].N = rule.site[size_t(i)].N;
    p.site[size_t(i)].k_in = rule.site[size_t(i)].k_in;
    p.site[size_t(i)].n_out = rule.site[size_t(i)].n_out;
  }
  layouts_ = p;
  std::ostringstream o;
  o << "gemm layouts (" << p.source << "):";
  int changed = 0;
  const char* kinds[3] = {"fwd", "dx", "dw"};
  for (int i = 0; i < kGemmSites; ++i)
    for (int k = 0; k < 3; ++k) {
      const GemmSiteLayout &a = p.site[size_t(i)], &r = rule.site[size_t(i)];
      const GemmForm f = k == 0 ? a.fwd : k == 1 ? a.dx : a.dw;
      const GemmForm rf = k == 0 ? r.fwd : k == 1 ? r.dx : r.dw;
      if (f == rf) continue;
      o << (changed++ ? ", " : " ") << kGemmSiteNames[size_t(i)] << "." << kinds[k] << " "
        << gemm_form_name(k == 0, f) << " (rule " << gemm_form_name(k == 0, rf) << ")";
    }
  o << (changed ? "; the other products as the rule" : " every product as the rule");
  layout_summary_ = o.str();
  return true;
}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

// Times every realizable form of each site's three products on this rank's shapes, on random
// bf16 operands laid out in the model's own buffers (the activations and gradient copies, which
// every step overwrites before reading; zeroed again afterwards, as constructed), so tuning adds
// no memory. Candidates of one product run interleaved, `rounds` times after a warm-up, and the
// median of each decides; the rule's form is left only for one at least 5% faster. A transposed
// product needs an fp32 scratch of its output (kernels::gemm_bf16), so it is a candidate only
// where that output is no larger than a layer's widest activation (not the vocabulary-wide
// products of the head). Then rank 0's choice is broadcast over the world (one plan per grid).
void ParallelTransformer::tune_gemm_layouts() {
  const auto t_start = std::chrono::steady_clock::now();
  GemmLayoutPlan plan = rule_gemm_layouts();
  plan.source = "tuned";
  const GemmLayoutPlan rule = plan;
  const bool can_dyt = wgrad_nn_ || (bf16_acts_ && ctx_.be->capabilities().bf16_producers);
  const int64_t N = int64_t(local_batch_) * local_len_;
  const int64_t widest = N * std::max({ctx_.dims.Cx, ctx_.dims.Ay, ctx_.dims.QKVy, ctx_.dims.FWy, ctx_.dims.Fy});

  // Operand space: X16 [N, k_in] and W16 [n_out, k_in] (bf16), the output (fp32), carved from
  // the activations before the gradient copies; dY16 / dY16ᵀ are the gradient copies.
  int64_t x_max = 0, w_max = 0, c_max = 0;
  for (const GemmSiteLayout& s : plan.site) {
    x_max = std::max(x_max, N * s.k_in);
    w_max = std::max(w_max, s.n_out * s.k_in);
    c_max = std::max({c_max, N * s.n_out, N * s.k_in, s.n_out * s.k_in});
  }
  const int64_t x_f = (x_max + 1) / 2 + 16, w_f = (w_max + 1) / 2 + 16, need = x_f + w_f + c_max;
  float* base = acts_.data();
  const int64_t avail = reinterpret_cast<float*>(a_->dout16) - base;
  backend::DeviceArray<float> own;  // only where the activations are too small (tiny models)
  if (avail < need) {
    own = backend::DeviceArray<float>(*ctx_.be, size_t(need));
    base = own.data();
  }
  uint16_t* X16 = reinterpret_cast<uint16_t*>(base);
  uint16_t* W16 = reinterpret_cast<uint16_t*>(base + x_f);
  float* C = base + x_f + w_f;
  {  // random values in [-1, 1): zeros run faster than real data
    const int64_t n16 = 2 * (x_f + w_f), nd = int64_t(a_->dout16_floats) * 2;
    std::vector<uint16_t> h(size_t(std::max(n16, nd)));
    uint64_t x = 0x9E3779B97F4A7C15ull ^ uint64_t(ctx_.g().world.rank());
    for (auto& v : h) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      v = backend::float_to_bf16(float(int64_t(x >> 40) - (1 << 23)) / float(1 << 23));
    }
    ctx_.bq().copy_to_device(base, h.data(), size_t(n16) * 2);
    ctx_.bq().copy_to_device(a_->dout16, h.data(), size_t(nd) * 2);
    ctx_.bq().copy_to_device(a_->dout16_t, h.data(), size_t(nd) * 2);
    ctx_.bq().fill_zero(C, size_t(c_max) * sizeof(float));
    ctx_.bq().synchronize();
  }
  const Operand x16{X16, backend::DType::BF16}, w16{W16, backend::DType::BF16},
      dy{a_->dout16, backend::DType::BF16}, dyt{a_->dout16_t, backend::DType::BF16};

  struct Cand {
    GemmForm f;
    std::vector<double> t;
  };
  std::ostringstream changed, kept;
  int n_changed = 0, n_kept = 0;
  const char* kinds[3] = {"fwd", "dx", "dw"};
  for (int i = 0; i < kGemmSites; ++i) {
    GemmSiteLayout& s = plan.site[size_t(i)];
    const int64_t k_in = s.k_in, n_out = s.n_out;
    for (int k = 0; k < 3; ++k) {
      std::vector<Cand> cands;
      const GemmForm rf = k == 0 ? s.fwd : k == 1 ? s.dx : s.dw;
      const int64_t out_elems = k == 0 ? N * n_out : k == 1 ? N * k_in : n_out * k_in;
      for (int ta = 0; ta < (k == 0 ? 1 : 2); ++ta)
        for (int tr = 0; tr < 2; ++tr) {
          const GemmForm f{ta == 1, tr == 1};
          const bool reads_dyt = k == 1 ? f.ta : k == 2 ? !f.ta : false;
          if (reads_dyt && !can_dyt) continue;
          if (f.transposed && out_elems > widest) continue;
          cands.push_back({f, {}});
        }
      auto run = [&](GemmForm f) {
        const backend::GemmProduct pr =
            f.transposed ? backend::GemmProduct::Transposed : backend::GemmProduct::Plain;
        if (k == 0)
          ops_->gemm("tune", false, true, N, n_out, k_in, x16, k_in, w16, k_in, 0.0f, C, n_out, pr);
        else if (k == 1)
          ops_->gemm("tune", f.ta, false, N, k_in, n_out, f.ta ? dyt : dy, f.ta ? N : n_out, w16, k_in,
               0.0f, C, k_in, pr);
        else
          ops_->gemm("tune", f.ta, false, n_out, k_in, N, f.ta ? dy : dyt, f.ta ? n_out : N, x16, k_in,
               1.0f, C, k_in, pr);
        ctx_.bq().synchronize();
      };
      const double flop = 2.0 * double(N) * double(k_in) * double(n_out);
      const int rounds = flop > 2e9 ? 3 : 5;
      for (Cand& c : cands) run(c.f);  // warm-up: primitive creation, caches
      for (int r = 0; r < rounds; ++r)
        for (Cand& c : cands) {
          const auto t0 = std::chrono::steady_clock::now();
          run(c.f);
          c.t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      double rule_rate = 0, best_rate = 0;
      GemmForm best = rf;
      for (const Cand& c : cands) {
        const double rate = flop / median(c.t) / 1e9;
        if (c.f == rf) rule_rate = rate;
        if (rate > best_rate) best_rate = rate, best = c.f;
      }
      const bool take = !(best == rf) && best_rate >= 1.05 * rule_rate;
      char buf[200];
      const std::string name = std::string(kGemmSiteNames[size_t(i)]) + "." + kinds[k];
      if (take) {
        (k == 0 ? s.fwd : k == 1 ? s.dx : s.dw) = best;
        std::snprintf(buf, sizeof buf, "%s %s (%.0f vs rule %s %.0f GFLOP/s)", name.c_str(),
                      gemm_form_name(k == 0, best).c_str(), best_rate,
                      gemm_form_name(k == 0, rf).c_str(), rule_rate);
        changed << (n_changed++ ? ", " : " ") << buf;
      } else {
        std::snprintf(buf, sizeof buf, "%s %s %.0f", name.c_str(), gemm_form_name(k == 0, rf).c_str(),
                      rule_rate);
        if (!(best == rf))
          std::snprintf(buf + std::strlen(buf), sizeof buf - std::strlen(buf), " (best other %s %.0f)",
                        gemm_form_name(k == 0, best).c_str(), best_rate);
        kept << (n_kept++ ? ", " : " ") << buf;
      }
    }
  }
  // Leave the model's buffers as constructed (zeros): nothing read before written depends on it,
  // but a constructed model is the same whether or not it tuned.
  if (own.empty()) ctx_.bq().fill_zero(acts_.data(), size_t(need) * sizeof(float));
  ctx_.bq().fill_zero(a_->dout16, size_t(a_->dout16_floats) * 4);
  ctx_.bq().fill_zero(a_->dout16_t, size_t(a_->dout16_floats) * 4);
  ctx_.bq().synchronize();

  // One plan per grid: rank 0's (every rank has the same local shapes).
  const comm::Communicator& world = ctx_.g().host().world;
  if (world.size() > 1) {
    std::vector<int32_t> codes(size_t(kGemmSites) * 3);
    for (int i = 0; i < kGemmSites; ++i) {
      const GemmSiteLayout& s = plan.site[size_t(i)];
      const GemmForm f[3] = {s.fwd, s.dx, s.dw};
      for (int k = 0; k < 3; ++k) codes[size_t(3 * i + k)] = int32_t(f[k].ta) | int32_t(f[k].transposed) << 1;
    }
    world.broadcast(codes.data(), codes.size(), 0);
    for (int i = 0; i < kGemmSites; ++i) {
      GemmSiteLayout& s = plan.site[size_t(i)];
      GemmForm* f[3] = {&s.fwd, &s.dx, &s.dw};
      for (int k = 0; k < 3; ++k) {
        const int32_t c = codes[size_t(3 * i + k)];
        *f[k] = {(c & 1) != 0, (c & 2) != 0};
      }
    }
  }
  check_gemm_layout_plan(plan);
  layouts_ = plan;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::ostringstream o;
  char head[96];
  std::snprintf(head, sizeof head, "gemm layouts (tuned in %.1f s", secs);
  o << head << (world.size() > 1 ? ", rank 0's choice on every rank" : "") << "):"
    << (n_changed ? changed.str() : std::string(" every product as the rule")) << "; kept:"
    << kept.str();
  (void)rule;
  layout_summary_ = o.str();
}

}  // namespace tetrad::parallel
