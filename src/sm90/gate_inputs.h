// What g and beta hold (flashkda.h: GateForm, g_dtype, beta_is_probability,
// beta_dtype), from ForwardArgs or DecodeArgs into the kernels' parameters
// (FwdParams, DecodeParams): the same fields in both.
#pragma once
#include <cstdint>

#include "flashkda/flashkda.h"

namespace flashkda::sm90 {

// g and beta as bf16 patterns (g, beta) or fp32 (g_f32, beta_f32; the other null),
// and the two forms as flags.
template <class Params, class Args>
void set_gate_inputs(Params& p, const Args& a) {
  const bool g_f32 = a.g_dtype == DType::kFP32, beta_f32 = a.beta_dtype == DType::kFP32;
  p.g = g_f32 ? nullptr : static_cast<const uint16_t*>(a.g);
  p.g_f32 = g_f32 ? static_cast<const float*>(a.g) : nullptr;
  p.beta = beta_f32 ? nullptr : static_cast<const uint16_t*>(a.beta);
  p.beta_f32 = beta_f32 ? static_cast<const float*>(a.beta) : nullptr;
  p.gate_log_decay = a.gate_form == GateForm::kLogDecay ? 1 : 0;
  p.beta_probability = a.beta_is_probability ? 1 : 0;
}

// Whether a call has general inputs (anything but the default bf16 raw gate and logit),
// which run kernels of their own (the prologue's kGeneralInputs, decode's kGeneral).
template <class Args>
bool has_general_inputs(const Args& a) {
  return a.gate_form != GateForm::kSafeGate || a.beta_is_probability || a.g_dtype == DType::kFP32 ||
         a.beta_dtype == DType::kFP32;
}

}  // namespace flashkda::sm90
