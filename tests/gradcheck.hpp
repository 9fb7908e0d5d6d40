// Finite-difference gradient checks for the tests (header-only).
//
// Usage: keep the inputs in a double buffer, write a closure that recomputes the scalar loss from
// that buffer (it is called after one element has been perturbed), compute the analytic gradient
// once, and compare:
//
//   std::vector<double> W = ..., dW(W.size(), 0.0);
//   auto loss = [&] { linear_forward(out.data(), x.data(), W.data(), ...);
//                     return weighted_sum(out, R); };
//   ... linear_backward(..., dW.data(), ...) ...
//   EXPECT_TRUE(gradient_matches("dW", W, dW, loss));
//
// Each checked element i gets the central difference (L(x_i + h) - L(x_i - h)) / (2h) (the step
// actually representable in double is used), compared with the analytic value a_i by
//   rel_i = |a_i - n_i| / max(floor, |a_i| + |n_i|).
// The worst rel_i and its index are reported; the check passes when it is below `tol`.
// The element is restored bit-exactly after each evaluation, so the buffer is unchanged at the end.
//
// On precision: the difference quotient carries rounding noise of about 1e-16 * |dL| / h, where
// dL is the part of the loss that the element moves (so ~1e-10 for O(1) outputs and h = 1e-6),
// plus a truncation error of h^2 * L''' / 6. A relative error only means something for entries
// well above that noise, so `floor` is the denominator below which the comparison becomes
// absolute: |a - n| < tol * floor (1e-8 with the defaults, 20x or more above the noise measured in
// the kernel tests; PyTorch's gradcheck allows atol 1e-5 + rtol 1e-3). Keep the affected
// outputs O(1): small shapes, L = Σ out ⊙ R with R in [-1, 1], summed by weighted_sum() in long
// double. A gradient that is tiny as a whole needs a smaller floor (or a scaled-up loss).
// Not thread-safe: the closure mutates shared state. TETRAD_GRADCHECK_VERBOSE=1 in the
// environment prints every check's worst error, to see the margins.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace tetrad::testing {

struct GradCheckOptions {
  double h = 1e-6;         // half-width of the central difference
  double tol = 1e-6;       // largest worst-case relative error that passes
  double floor = 1e-2;     // smallest denominator of the relative error (see above)
  int64_t max_checks = 0;  // 0: every element; otherwise this many, evenly spaced, for big tensors
};

struct GradCheckResult {
  double worst_rel = 0;      // worst relative error over the checked elements
  int64_t worst_index = -1;  // element where it occurred (-1 if nothing was checked)
  double analytic = 0;       // analytic gradient at worst_index
  double numeric = 0;        // finite-difference gradient at worst_index
  int64_t checked = 0;       // number of elements checked
};

// dL/dx[i] by central differences; x[i] is restored exactly.
inline double central_difference(double* x, int64_t i, const std::function<double()>& loss,
                                 double h) {
  const double x0 = x[i];
  const double xp = x0 + h, xm = x0 - h;
  x[i] = xp;
  const double lp = loss();
  x[i] = xm;
  const double lm = loss();
  x[i] = x0;
  return (lp - lm) / (xp - xm);
}

// Compares analytic[0, n) with central differences of loss() with respect to x[0, n).
inline GradCheckResult check_gradient(double* x, int64_t n, const double* analytic,
                                      const std::function<double()>& loss,
                                      const GradCheckOptions& opt = {}) {
  GradCheckResult r;
  const int64_t count = (opt.max_checks > 0 && opt.max_checks < n) ? opt.max_checks : n;
  for (int64_t k = 0; k < count; ++k) {
    // Evenly spaced subset when count < n (always includes the first element).
    const int64_t i = (count == n) ? k : (k * n) / count;
    const double num = central_difference(x, i, loss, opt.h);
    const double a = analytic[i];
    const double rel = std::abs(a - num) / std::max(opt.floor, std::abs(a) + std::abs(num));
    // A NaN on either side counts as an infinite error rather than being skipped.
    const bool worse = std::isnan(rel) || rel > r.worst_rel || r.worst_index < 0;
    if (worse) {
      r.worst_rel = std::isnan(rel) ? INFINITY : rel;
      r.worst_index = i;
      r.analytic = a;
      r.numeric = num;
    }
    ++r.checked;
  }
  return r;
}

inline GradCheckResult check_gradient(std::vector<double>& x, const std::vector<double>& analytic,
                                      const std::function<double()>& loss,
                                      const GradCheckOptions& opt = {}) {
  EXPECT_EQ(x.size(), analytic.size()) << "gradient and input differ in size";
  return check_gradient(x.data(), int64_t(std::min(x.size(), analytic.size())), analytic.data(),
                        loss, opt);
}

inline std::string describe(const std::string& what, const GradCheckResult& r,
                            const GradCheckOptions& opt) {
  std::ostringstream os;
  os.precision(6);
  os << what << ": worst relative error " << r.worst_rel << " at index " << r.worst_index
     << " (analytic " << r.analytic << ", finite difference " << r.numeric << ") over " << r.checked
     << " elements; tolerance " << opt.tol;
  return os.str();
}

// For EXPECT_TRUE / ASSERT_TRUE: fails with the worst element named.
inline ::testing::AssertionResult gradient_matches(const std::string& what, double* x, int64_t n,
                                                   const double* analytic,
                                                   const std::function<double()>& loss,
                                                   const GradCheckOptions& opt = {}) {
  const GradCheckResult r = check_gradient(x, n, analytic, loss, opt);
  if (std::getenv("TETRAD_GRADCHECK_VERBOSE"))
    std::fprintf(stderr, "%s\n", describe(what, r, opt).c_str());
  if (r.checked > 0 && r.worst_rel < opt.tol)
    return ::testing::AssertionSuccess() << describe(what, r, opt);
  if (r.checked == 0) return ::testing::AssertionFailure() << what << ": no elements checked";
  return ::testing::AssertionFailure() << describe(what, r, opt);
}

inline ::testing::AssertionResult gradient_matches(const std::string& what, std::vector<double>& x,
                                                   const std::vector<double>& analytic,
                                                   const std::function<double()>& loss,
                                                   const GradCheckOptions& opt = {}) {
  if (x.size() != analytic.size())
    return ::testing::AssertionFailure()
           << what << ": input has " << x.size() << " elements, gradient " << analytic.size();
  return gradient_matches(what, x.data(), int64_t(x.size()), analytic.data(), loss, opt);
}

// Σ out[i] * weight[i], accumulated in long double so that the summation adds no noise to the
// finite differences; the usual test loss L = Σ out ⊙ R, whose gradient with respect to out is R.
inline double weighted_sum(const double* out, const double* weight, int64_t n) {
  long double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<long double>(out[i]) * weight[i];
  return static_cast<double>(s);
}
inline double weighted_sum(const std::vector<double>& out, const std::vector<double>& weight) {
  EXPECT_EQ(out.size(), weight.size());
  return weighted_sum(out.data(), weight.data(), int64_t(std::min(out.size(), weight.size())));
}

}  // namespace tetrad::testing
