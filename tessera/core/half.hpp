#pragma once
// 16-bit floating types: stored as 16 bits, computed in f32.
#include <bit>
#include <cstdint>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

namespace detail {

/// IEEE binary32 -> binary16 bits, round to nearest even; overflow gives inf, NaN stays NaN.
constexpr uint16_t float_to_half_bits(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u)  // inf or NaN (keep NaN quiet and non-zero)
    return static_cast<uint16_t>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u | ((magnitude >> 13) & 0x3ffu) : 0u));
  if (magnitude >= 0x477ff000u)  // >= 65520 rounds to inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) {  // below 2^-14: subnormal half; let an f32 add do the rounding
    const float shifted = std::bit_cast<float>(magnitude) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
  }
  const uint32_t odd = (magnitude >> 13) & 1u;
  magnitude += 0xc8000fffu + odd;  // rebias exponent by -112 and round the 13 dropped bits
  return static_cast<uint16_t>(sign | (magnitude >> 13));
}

/// IEEE binary16 bits -> binary32 (exact).
constexpr float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    const float subnormal = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -subnormal : subnormal;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// binary32 -> bfloat16 bits, round to nearest even; NaN stays NaN.
constexpr uint16_t float_to_bfloat16_bits(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

constexpr float bfloat16_bits_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

}  // namespace detail

/// IEEE half precision. Converts implicitly to and from float; arithmetic happens in float.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  constexpr Half(float value) : bits(detail::float_to_half_bits(value)) {}  // NOLINT: implicit by design
  constexpr operator float() const { return detail::half_bits_to_float(bits); }
  static constexpr Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

/// bfloat16 (8-bit exponent, 7-bit mantissa). Converts implicitly to and from float.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  constexpr BFloat16(float value) : bits(detail::float_to_bfloat16_bits(value)) {}  // NOLINT: implicit by design
  constexpr operator float() const { return detail::bfloat16_bits_to_float(bits); }
  static constexpr BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

}  // namespace tessera
