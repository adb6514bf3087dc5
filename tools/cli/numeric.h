// Storage dtypes on the host: element loads/stores and rounding in any of the tool's dtypes, on
// the CPU backend's fp16/bf16 conversions (src/cpu/convert.h, header-only). The CLI needs them to
// make inputs and to read outputs without depending on the test library.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/convert.h"
#include "fusedattn/tensor.h"

namespace fusedattn::cli::numeric {

// The CPU backend's conversions (round to nearest even, by hand): one implementation for both
// (this unit's build of them, cpu/isa.h).
using cpu::FUSEDATTN_CPU_ISA::bf16_to_float;
using cpu::FUSEDATTN_CPU_ISA::float_to_bf16;
using cpu::FUSEDATTN_CPU_ISA::float_to_half;
using cpu::FUSEDATTN_CPU_ISA::half_to_float;

// Element `index` of an array of `dtype` values, as a double.
inline double load(DType dtype, const void* base, int64_t index) {
  switch (dtype) {
    case DType::kFloat16: return half_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

inline void store(DType dtype, void* base, int64_t index, double value) {
  const auto f = static_cast<float>(value);
  switch (dtype) {
    case DType::kFloat16: static_cast<uint16_t*>(base)[index] = float_to_half(f); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[index] = float_to_bf16(f); break;
    default: static_cast<float*>(base)[index] = f; break;
  }
}

// `value` rounded to `dtype` (through fp32, as a kernel's conversion instructions do).
inline float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::kFloat16: return half_to_float(float_to_half(value));
    case DType::kBFloat16: return bf16_to_float(float_to_bf16(value));
    default: return value;
  }
}

// Relative rounding step of a dtype (2^-mantissa bits), used to scale tolerances.
inline double epsilon(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return std::ldexp(1.0, -10);
    case DType::kBFloat16: return std::ldexp(1.0, -7);
    default: return std::ldexp(1.0, -23);
  }
}

}  // namespace fusedattn::cli::numeric
