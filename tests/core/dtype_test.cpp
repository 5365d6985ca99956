#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <tessera/core/dtype.hpp>

#include <test_util.hpp>

using namespace tessera;
using namespace tessera::testing;

TEST(DType, NamesRoundTrip) {
  for (DType d : all_dtypes())
    EXPECT_EQ(dtype_from_string(name(d)), d);
  EXPECT_EQ(name(DType::bf16), "bf16");
  EXPECT_EQ(itemsize(DType::f16), 2);
  EXPECT_EQ(itemsize(DType::i64), 8);
  EXPECT_EQ(itemsize(DType::b8), 1);
}

TEST(DType, UnknownNameThrows) {
  EXPECT_TRUE(value_error([] { (void)dtype_from_string("f8"); }, {"[dtype_from_string] unknown dtype 'f8'"}));
}

TEST(DType, Promotion) {
  EXPECT_EQ(promote_types(DType::f32, DType::f32), DType::f32);
  EXPECT_EQ(promote_types(DType::b8, DType::u8), DType::u8);
  EXPECT_EQ(promote_types(DType::u8, DType::i32), DType::i32);
  EXPECT_EQ(promote_types(DType::i32, DType::i64), DType::i64);
  EXPECT_EQ(promote_types(DType::i64, DType::f16), DType::f16);
  EXPECT_EQ(promote_types(DType::f16, DType::bf16), DType::f32);
  EXPECT_EQ(promote_types(DType::bf16, DType::f64), DType::f64);
  EXPECT_EQ(promote_types(DType::f32, DType::f64), DType::f64);
  EXPECT_EQ(promote_types(DType::b8, DType::f16), DType::f16);
  // symmetric
  for (int i = 0; i < kNumDTypes; ++i)
    for (int j = 0; j < kNumDTypes; ++j)
      EXPECT_EQ(promote_types(DType(i), DType(j)), promote_types(DType(j), DType(i)));
}

TEST(Half, KnownBitPatterns) {
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(Half(-2.0f).bits, 0xc000);
  EXPECT_EQ(Half(65504.0f).bits, 0x7bff);               // largest finite
  EXPECT_EQ(Half(65520.0f).bits, 0x7c00);               // rounds to inf
  EXPECT_EQ(Half(5.9604645e-8f).bits, 0x0001);          // smallest subnormal
  EXPECT_EQ(Half(6.1035156e-5f).bits, 0x0400);          // smallest normal
  EXPECT_EQ(Half(1.0f + 1.0f / 2048).bits, 0x3c00);     // tie rounds to even
  EXPECT_EQ(Half(1.0f + 3.0f / 2048).bits, 0x3c02);     // tie rounds to even (up)
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x3555)), 0.333251953125f);
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x0001)), 5.9604644775390625e-8f);
}

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const Half h = Half::from_bits(static_cast<uint16_t>(bits));
    const float f = h;
    if (std::isnan(f)) continue;
    EXPECT_EQ(Half(f).bits, bits) << std::hex << bits;
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(BFloat16(3.140625f)), 3.140625f);
  EXPECT_EQ(BFloat16(1.0f + 1.0f / 256).bits, 0x3f80);  // tie to even
  EXPECT_EQ(BFloat16(1.0f + 3.0f / 256).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Convert, SaturatesAndDefinesNaN) {
  EXPECT_EQ(convert<int32_t>(1e20), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(convert<int32_t>(-1e20), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(convert<uint8_t>(-3.0f), 0);
  EXPECT_EQ(convert<int64_t>(std::nan("")), 0);
  EXPECT_EQ(convert<int32_t>(-2.7), -2);
  EXPECT_TRUE(convert<bool>(0.5f));
  EXPECT_FALSE(convert<bool>(Half(0.0f)));
  EXPECT_EQ(static_cast<float>(convert<Half>(int64_t{3})), 3.0f);
}
