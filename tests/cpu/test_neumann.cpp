// neumann_inverse_16: (I + L)^{-1} for strictly lower-triangular 16x16 L.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/cpu_backends.h"

namespace flashkda::cpu {
namespace {

constexpr int C = 16;

// max |(I + L)·INV − I| over all entries, in double.
double identity_residual(const std::vector<float>& L, const std::vector<float>& inv) {
  double worst = 0;
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < C; ++j) {
      double s = inv[i * C + j];  // the I·INV part
      for (int p = 0; p < C; ++p) s += double(L[i * C + p]) * inv[p * C + j];
      worst = std::max(worst, std::abs(s - (i == j ? 1.0 : 0.0)));
    }
  return worst;
}

// (I + L)^{-1} by forward substitution in double, column by column.
std::vector<double> inverse_by_substitution(const std::vector<float>& L) {
  std::vector<double> X(C * C, 0.0);
  for (int j = 0; j < C; ++j)
    for (int i = 0; i < C; ++i) {
      double s = i == j ? 1.0 : 0.0;
      for (int p = 0; p < i; ++p) s -= double(L[i * C + p]) * X[p * C + j];
      X[i * C + j] = s;
    }
  return X;
}

TEST(Neumann, RandomStrictlyLowerMatchesInverse) {
  std::mt19937_64 rng(71);
  std::uniform_real_distribution<float> uni(-0.3f, 0.3f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> L(C * C, 0.f), inv(C * C, -7.f);
    for (int i = 0; i < C; ++i)
      for (int j = 0; j < i; ++j) L[i * C + j] = uni(rng);
    neumann_inverse_16(L.data(), inv.data());
    ASSERT_LE(identity_residual(L, inv), 1e-5) << "trial " << trial;
    const std::vector<double> ref = inverse_by_substitution(L);
    double worst = 0;
    for (int i = 0; i < C * C; ++i) worst = std::max(worst, std::abs(inv[i] - ref[i]));
    ASSERT_LE(worst, 1e-5) << "trial " << trial;
    // Strictly upper part of the inverse is exactly zero, the diagonal exactly one.
    for (int i = 0; i < C; ++i) {
      ASSERT_EQ(inv[i * C + i], 1.f);
      for (int j = i + 1; j < C; ++j) ASSERT_EQ(inv[i * C + j], 0.f);
    }
  }
}

// L = the subdiagonal of ones: (I + L)^{-1}_{ij} = (−1)^{i−j} for i ≥ j. All
// intermediate values are small integers, so fp32 gives it exactly; every power
// up to N^15 is needed, so a missing or wrong Neumann factor shows up.
TEST(Neumann, SubdiagonalOnesIsExact) {
  std::vector<float> L(C * C, 0.f), inv(C * C);
  for (int i = 1; i < C; ++i) L[i * C + i - 1] = 1.f;
  neumann_inverse_16(L.data(), inv.data());
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < C; ++j) {
      const float expect = j > i ? 0.f : ((i - j) % 2 == 0 ? 1.f : -1.f);
      ASSERT_EQ(inv[i * C + j], expect) << i << "," << j;
    }
}

TEST(Neumann, ZeroGivesIdentity) {
  std::vector<float> L(C * C, 0.f), inv(C * C, 3.f);
  neumann_inverse_16(L.data(), inv.data());
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < C; ++j) ASSERT_EQ(inv[i * C + j], i == j ? 1.f : 0.f);
}

}  // namespace
}  // namespace flashkda::cpu
