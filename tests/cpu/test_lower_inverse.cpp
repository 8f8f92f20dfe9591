// unit_lower_inverse_16: (I + L)^{-1} for strictly lower-triangular 16x16 L, on
// random L and on the worst cases of the chunked algorithm (|L_ij| -> 1).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/cpu_backends.h"

namespace flashkda::cpu {
namespace {

constexpr int C = 16;

// (I + L)^{-1} by forward substitution in double, column by column: the reference.
std::vector<double> inverse_f64(const std::vector<float>& L) {
  std::vector<double> X(C * C, 0.0);
  for (int j = 0; j < C; ++j)
    for (int i = 0; i < C; ++i) {
      double s = i == j ? 1.0 : 0.0;
      for (int p = 0; p < i; ++p) s -= double(L[i * C + p]) * X[p * C + j];
      X[i * C + j] = s;
    }
  return X;
}

// max |inv − ref| / max(1, max |ref|): the error relative to the inverse's own size.
double scaled_error(const std::vector<float>& L) {
  std::vector<float> inv(C * C, -7.f);
  unit_lower_inverse_16(L.data(), inv.data());
  const std::vector<double> ref = inverse_f64(L);
  double worst = 0, size = 1;
  for (int i = 0; i < C * C; ++i) {
    if (!std::isfinite(inv[i])) return INFINITY;
    worst = std::max(worst, std::abs(inv[i] - ref[i]));
    size = std::max(size, std::abs(ref[i]));
  }
  for (int i = 0; i < C; ++i) {  // the structure is exact: unit diagonal, zero upper triangle
    EXPECT_EQ(inv[i * C + i], 1.f);
    for (int j = i + 1; j < C; ++j) EXPECT_EQ(inv[i * C + j], 0.f);
  }
  return worst / size;
}

// fp32 rounding of a 16-term substitution: a few ulp of 2^-24 times the row length.
constexpr double kFp32Bar = 1e-5;

TEST(UnitLowerInverse, RandomStrictlyLower) {
  std::mt19937_64 rng(71);
  for (float range : {0.3f, 1.0f}) {
    std::uniform_real_distribution<float> uni(-range, range);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> L(C * C, 0.f);
      for (int i = 0; i < C; ++i)
        for (int j = 0; j < i; ++j) L[i * C + j] = uni(rng);
      ASSERT_LE(scaled_error(L), kFp32Bar) << "range " << range << " trial " << trial;
    }
  }
}

// The chunk's L for keys k_i: L_ij = b_i (k_i·k_j) 2^(G_i − G_j), i > j. Collinear
// keys with b → 1 and no decay give b·(all-ones strictly lower), whose powers
// reach C(15,7) = 6435; anti-aligned keys give alternating signs.
TEST(UnitLowerInverse, CollinearAndAntiAlignedKeys) {
  for (float b : {1.f, 0.99966f, 0.5f}) {
    for (int sign_pattern = 0; sign_pattern < 2; ++sign_pattern) {
      std::vector<float> L(C * C, 0.f);
      for (int i = 0; i < C; ++i)
        for (int j = 0; j < i; ++j) L[i * C + j] = b * (sign_pattern && (i - j) % 2 ? -1.f : 1.f);
      EXPECT_LE(scaled_error(L), kFp32Bar) << "b " << b << " signs " << sign_pattern;
    }
  }
}

// The whole family the chunked algorithm can produce: Gram matrices of unit keys
// near one direction (noise eps), decays near 1, b near 1.
TEST(UnitLowerInverse, NearCollinearGram) {
  std::mt19937_64 rng(72);
  std::normal_distribution<double> normal(0, 1);
  for (double eps : {0.0, 1e-3, 1e-2, 0.1}) {
    for (int trial = 0; trial < 20; ++trial) {
      constexpr int K = 128;
      std::vector<double> d(K), keys(C * K);
      for (auto& x : d) x = normal(rng);
      for (int i = 0; i < C; ++i) {
        double ss = 0;
        for (int e = 0; e < K; ++e) ss += (keys[i * K + e] = d[e] + eps * normal(rng)) * keys[i * K + e];
        for (int e = 0; e < K; ++e) keys[i * K + e] /= std::sqrt(ss);
      }
      std::vector<float> L(C * C, 0.f);
      for (int i = 0; i < C; ++i)
        for (int j = 0; j < i; ++j) {
          double dot = 0;
          for (int e = 0; e < K; ++e) dot += keys[i * K + e] * keys[j * K + e];
          L[i * C + j] = static_cast<float>(0.99966 * dot * std::exp2(-1e-4 * (i - j)));
        }
      ASSERT_LE(scaled_error(L), kFp32Bar) << "eps " << eps << " trial " << trial;
    }
  }
}

// L = the subdiagonal of ones: (I + L)^{-1}_{ij} = (−1)^{i−j} for i >= j, exact.
TEST(UnitLowerInverse, SubdiagonalOnesIsExact) {
  std::vector<float> L(C * C, 0.f), inv(C * C);
  for (int i = 1; i < C; ++i) L[i * C + i - 1] = 1.f;
  unit_lower_inverse_16(L.data(), inv.data());
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < C; ++j) {
      const float expect = j > i ? 0.f : ((i - j) % 2 == 0 ? 1.f : -1.f);
      ASSERT_EQ(inv[i * C + j], expect) << i << "," << j;
    }
}

TEST(UnitLowerInverse, ZeroGivesIdentity) {
  std::vector<float> L(C * C, 0.f), inv(C * C, 3.f);
  unit_lower_inverse_16(L.data(), inv.data());
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < C; ++j) ASSERT_EQ(inv[i * C + j], i == j ? 1.f : 0.f);
}

}  // namespace
}  // namespace flashkda::cpu
