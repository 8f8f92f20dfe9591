// The accuracy bars of spec section 2 (relative RMS against the float64 oracle),
// one copy for every test that judges a backend by them: out and the fp32 final
// state; out and state where the state passes through bf16; the degenerate-key
// class (tests/common/degenerate_problem.h).
#pragma once

namespace flashkda::testing {
constexpr double kOutBar = 3.5e-3;
constexpr double kStateBar = 2.5e-3;
constexpr double kBf16StateBar = 6e-3;
constexpr double kDegenerateBar = 1e-2;
}  // namespace flashkda::testing
