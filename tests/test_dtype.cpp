// Tests of the element-format table (src/core/dtype.*) and of the 16-bit
// float conversions it relies on (src/core/half.h).
//
// Expected values here are computed independently of the implementation:
// hand-built blocks are assembled from the layout as documented (element ->
// byte/bit position), rather than by calling the code under test, and the
// fixture test compares against the `gguf` Python package.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"

namespace megakern {
namespace {

constexpr DType kAllTypes[] = {DType::F32,    DType::F16,      DType::BF16,   DType::Q4_0,      DType::Q4_1,
                               DType::Q5_0,   DType::Q8_0,     DType::Q4_K,   DType::Q6_K,      DType::Q3_K,
                               DType::Q5_K,   DType::IQ4_NL,   DType::IQ4_XS, DType::MXFP4,     DType::FP8_E4M3,
                               DType::NVFP4,  DType::INT4_G128, DType::INT8_COL};

TEST(DTypeTable, AllDtypesListsTheTable) {
  size_t n = 0;
  const DType* all = all_dtypes(&n);
  ASSERT_EQ(n, std::size(kAllTypes));
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(all[i], kAllTypes[i]);
}

float f32_from_bits(uint32_t u) { return bits_to_f32(u); }

// ---------------------------------------------------------------------------
// f16 / bf16 conversions.

TEST(HalfConversion, F16RoundTripsEveryBitPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32((uint16_t)h);
    const uint16_t back = f32_to_f16(f);
    const bool is_nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (is_nan) {
      // NaN payloads are not preserved (the quiet bit is forced), but NaN
      // stays NaN with its sign.
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(back & 0x7c00u, 0x7c00u) << std::hex << h;
      ASSERT_NE(back & 0x3ffu, 0u) << std::hex << h;
      ASSERT_EQ(back & 0x8000u, h & 0x8000u) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(HalfConversion, F16ToF32MatchesDefinition) {
  // value = (-1)^s * 2^(e-15) * (1 + m/1024) for normals, 2^-14 * m/1024 for
  // subnormals; both are exact in double, and so in f32.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) continue;
    const double mag = e == 0 ? std::ldexp((double)m, -24) : std::ldexp(1024.0 + m, (int)e - 25);
    const double expected = (h & 0x8000u) ? -mag : mag;
    ASSERT_EQ(f16_to_f32((uint16_t)h), (float)expected) << std::hex << h;
    if (e == 0 && m == 0) {
      ASSERT_EQ(std::signbit(f16_to_f32((uint16_t)h)), (h & 0x8000u) != 0);
    }
  }
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
}

TEST(HalfConversion, F16RoundsToNearestEven) {
  // Exhaustively: the exact midpoint between two adjacent finite halves goes
  // to the one with an even mantissa, and one f32 ulp either side of it goes
  // to the nearer one. This covers subnormals and the subnormal/normal seam.
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t h = 0; h < 0x7bff; ++h) {
      const double lo = f16_to_f32((uint16_t)(sign | h));
      const double hi = f16_to_f32((uint16_t)(sign | (h + 1)));
      const float mid = (float)((lo + hi) / 2);  // exact: needs 12 significant bits
      ASSERT_EQ((double)mid, (lo + hi) / 2);
      const uint16_t even = (uint16_t)(sign | ((h & 1) ? h + 1 : h));
      ASSERT_EQ(f32_to_f16(mid), even) << std::hex << h;
      const float toward_lo = std::nextafter(mid, (float)lo), toward_hi = std::nextafter(mid, (float)hi);
      ASSERT_EQ(f32_to_f16(toward_lo), (uint16_t)(sign | h)) << std::hex << h;
      ASSERT_EQ(f32_to_f16(toward_hi), (uint16_t)(sign | (h + 1))) << std::hex << h;
    }
  }
  // A few cases spelled out.
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      // tie, rounds down to even 1.0
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie, rounds up to even
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);             // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(f32_to_f16(3 * 0x1p-26f), 0x0001);         // above that tie
  EXPECT_EQ(f32_to_f16(1.5f * 0x1p-24f), 0x0002);      // tie between 1 and 2 -> 2
  EXPECT_EQ(f32_to_f16(2.5f * 0x1p-24f), 0x0002);      // tie between 2 and 3 -> 2
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);  // largest subnormal tie -> smallest normal
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_f16(-1e-10f), 0x8000);  // underflow keeps the sign
  EXPECT_EQ(f32_to_f16(f32_from_bits(1)), 0x0000);  // f32 subnormal
}

TEST(HalfConversion, F16OverflowsToInfinity) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);  // below the tie with 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                         // tie rounds to even = inf
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1e30f), 0x7c00);
  EXPECT_EQ(f32_to_f16(FLT_MAX), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  const uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x3ff, 0);
  // A signalling NaN whose payload sits only in the low bits must not become inf.
  const uint16_t snan = f32_to_f16(f32_from_bits(0x7f800001u));
  EXPECT_EQ(snan & 0x7c00, 0x7c00);
  EXPECT_NE(snan & 0x3ff, 0);
}

TEST(HalfConversion, Bf16RoundTripsEveryBitPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32((uint16_t)h);
    ASSERT_EQ(f32_to_bits(f), h << 16);
    const bool is_nan = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f)))) << std::hex << h;
    } else {
      ASSERT_EQ(f32_to_bf16(f), h) << std::hex << h;
    }
  }
}

TEST(HalfConversion, Bf16RoundsToNearestEven) {
  // In f32 bits, the midpoint between bf16 values h and h+1 is h<<16 | 0x8000.
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t h = 0; h < 0x7f7f; ++h) {
      const uint32_t mid = ((sign | h) << 16) | 0x8000u;
      const uint16_t even = (uint16_t)(sign | ((h & 1) ? h + 1 : h));
      ASSERT_EQ(f32_to_bf16(f32_from_bits(mid)), even) << std::hex << h;
      ASSERT_EQ(f32_to_bf16(f32_from_bits(mid - 1)), (uint16_t)(sign | h)) << std::hex << h;
      ASSERT_EQ(f32_to_bf16(f32_from_bits(mid + 1)), (uint16_t)(sign | (h + 1))) << std::hex << h;
    }
  }
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);      // tie -> even (1.0)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie -> even (1 + 2^-6)
  EXPECT_EQ(f32_to_bf16(FLT_MAX), 0x7f80);             // rounds past the largest bf16 to inf
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f32_from_bits(0x7f800001u)))));  // not inf
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

// ---------------------------------------------------------------------------
// The traits table and the name/id lookups.

TEST(DTypeTable, TraitsDescribeEachFormat) {
  struct Expect {
    DType t;
    const char* name;
    int64_t block_size;
    size_t block_bytes;
  };
  // Sizes from GGML's block structs.
  const Expect expect[] = {
      {DType::F32, "f32", 1, 4},       {DType::F16, "f16", 1, 2},       {DType::BF16, "bf16", 1, 2},
      {DType::Q4_0, "q4_0", 32, 18},   {DType::Q4_1, "q4_1", 32, 20},   {DType::Q5_0, "q5_0", 32, 22},
      {DType::Q8_0, "q8_0", 32, 34},   {DType::Q4_K, "q4_k", 256, 144}, {DType::Q6_K, "q6_k", 256, 210},
      {DType::MXFP4, "mxfp4", 32, 17}, {DType::FP8_E4M3, "fp8_e4m3", 32, 33}, {DType::NVFP4, "nvfp4", 64, 36},
      {DType::INT4_G128, "int4_g128", 128, 66}, {DType::INT8_COL, "int8_col", 128, 132},
      {DType::Q3_K, "q3_k", 256, 110}, {DType::Q5_K, "q5_k", 256, 176}, {DType::IQ4_NL, "iq4_nl", 32, 18},
      {DType::IQ4_XS, "iq4_xs", 256, 136},
  };
  for (const Expect& e : expect) {
    const DTypeTraits& tr = dtype_traits(e.t);
    EXPECT_EQ(tr.type, e.t);
    EXPECT_STREQ(tr.name, e.name);
    EXPECT_EQ(tr.block_size, e.block_size) << e.name;
    EXPECT_EQ(tr.block_bytes, e.block_bytes) << e.name;
    EXPECT_NE(tr.dequantize, nullptr);
    EXPECT_NE(tr.quantize, nullptr);
    EXPECT_NE(tr.dot, nullptr);
    EXPECT_EQ(dtype_from_ggml((uint32_t)e.t), e.t) << e.name;
    EXPECT_EQ(dtype_from_name(e.name), e.t) << e.name;
    if ((uint32_t)e.t < 64) EXPECT_EQ(ggml_type_name((uint32_t)e.t), e.name);  // ours (>= 64) are not GGML's
  }
  // Our own ids stay clear of GGML's.
  for (DType t : {DType::FP8_E4M3, DType::NVFP4, DType::INT4_G128, DType::INT8_COL}) {
    EXPECT_GE((uint32_t)t, 64u);
    EXPECT_EQ(ggml_type_name((uint32_t)t), "unknown");
  }
  EXPECT_EQ((uint32_t)DType::MXFP4, 39u);
  EXPECT_EQ((uint32_t)DType::Q3_K, 11u);
  EXPECT_EQ((uint32_t)DType::Q5_K, 13u);
  EXPECT_EQ((uint32_t)DType::IQ4_NL, 20u);
  EXPECT_EQ((uint32_t)DType::IQ4_XS, 23u);
}

TEST(DTypeTable, UnsupportedTypeThrowsNamingIt) {
  try {
    (void)dtype_traits(static_cast<DType>(10));
    FAIL() << "expected megakern::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q2_k"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)dtype_traits(static_cast<DType>(999)), Error);
  EXPECT_THROW((void)row_bytes(static_cast<DType>(10), 256), Error);
}

TEST(DTypeTable, FromGgmlUnknownIdsAreNullopt) {
  int supported = 0;
  for (uint32_t id = 0; id < 200; ++id) {
    const auto t = dtype_from_ggml(id);
    if (t) {
      ++supported;
      EXPECT_EQ((uint32_t)*t, id);
    }
  }
  EXPECT_EQ(supported, 18);
  for (uint32_t id : {4u, 5u, 7u, 9u, 10u, 15u, 16u, 21u, 22u, 28u, 31u, 40u, 63u, 68u, 0xffffffffu}) {
    EXPECT_FALSE(dtype_from_ggml(id).has_value()) << id;
  }
}

TEST(DTypeTable, GgmlTypeNamesFollowGgml) {
  EXPECT_EQ(ggml_type_name(0), "f32");
  EXPECT_EQ(ggml_type_name(7), "q5_1");
  EXPECT_EQ(ggml_type_name(9), "q8_1");
  EXPECT_EQ(ggml_type_name(10), "q2_k");
  EXPECT_EQ(ggml_type_name(11), "q3_k");
  EXPECT_EQ(ggml_type_name(13), "q5_k");
  EXPECT_EQ(ggml_type_name(15), "q8_k");
  EXPECT_EQ(ggml_type_name(16), "iq2_xxs");
  EXPECT_EQ(ggml_type_name(17), "iq2_xs");
  EXPECT_EQ(ggml_type_name(18), "iq3_xxs");
  EXPECT_EQ(ggml_type_name(19), "iq1_s");
  EXPECT_EQ(ggml_type_name(20), "iq4_nl");
  EXPECT_EQ(ggml_type_name(21), "iq3_s");
  EXPECT_EQ(ggml_type_name(22), "iq2_s");
  EXPECT_EQ(ggml_type_name(23), "iq4_xs");
  EXPECT_EQ(ggml_type_name(24), "i8");
  EXPECT_EQ(ggml_type_name(27), "i64");
  EXPECT_EQ(ggml_type_name(28), "f64");
  EXPECT_EQ(ggml_type_name(29), "iq1_m");
  EXPECT_EQ(ggml_type_name(30), "bf16");
  EXPECT_EQ(ggml_type_name(34), "tq1_0");
  EXPECT_EQ(ggml_type_name(35), "tq2_0");
  EXPECT_EQ(ggml_type_name(39), "mxfp4");
  for (uint32_t id = 0; id < 40; ++id) {
    EXPECT_FALSE(ggml_type_name(id).empty()) << id;
    EXPECT_NE(ggml_type_name(id), "unknown") << id;
  }
  EXPECT_EQ(ggml_type_name(1000), "unknown");
  EXPECT_EQ(ggml_type_name(0xffffffffu), "unknown");
}

TEST(DTypeTable, FromNameIsCaseInsensitive) {
  EXPECT_EQ(dtype_from_name("Q4_K"), DType::Q4_K);
  EXPECT_EQ(dtype_from_name("q6_K"), DType::Q6_K);
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_EQ(dtype_from_name("F16"), DType::F16);
  EXPECT_EQ(dtype_from_name("f32"), DType::F32);
  EXPECT_EQ(dtype_from_name("Q8_0"), DType::Q8_0);
  EXPECT_FALSE(dtype_from_name("").has_value());
  EXPECT_FALSE(dtype_from_name(" f16").has_value());
  EXPECT_FALSE(dtype_from_name("q2_k").has_value());  // known to GGML, not supported here
  EXPECT_FALSE(dtype_from_name("q4_k_m").has_value());
  EXPECT_FALSE(dtype_from_name("q4").has_value());
  EXPECT_EQ(dtype_from_name("MXFP4"), DType::MXFP4);
  EXPECT_EQ(dtype_from_name("fp8_e4m3"), DType::FP8_E4M3);
  EXPECT_EQ(dtype_from_name("NVFP4"), DType::NVFP4);
  EXPECT_EQ(dtype_from_name("int4_g128"), DType::INT4_G128);
  EXPECT_EQ(dtype_from_name("INT8_COL"), DType::INT8_COL);
  EXPECT_EQ(dtype_from_name("Q3_K"), DType::Q3_K);
  EXPECT_EQ(dtype_from_name("q5_k"), DType::Q5_K);
  EXPECT_EQ(dtype_from_name("IQ4_NL"), DType::IQ4_NL);
  EXPECT_EQ(dtype_from_name("iq4_xs"), DType::IQ4_XS);
  EXPECT_FALSE(dtype_from_name("q5_k_m").has_value());
}

TEST(DTypeTable, RowBytes) {
  EXPECT_EQ(row_bytes(DType::F32, 7), 28u);
  EXPECT_EQ(row_bytes(DType::BF16, 3), 6u);
  EXPECT_EQ(row_bytes(DType::Q4_0, 64), 36u);
  EXPECT_EQ(row_bytes(DType::Q4_0, 0), 0u);
  EXPECT_EQ(row_bytes(DType::Q8_0, 4096), 4096u / 32 * 34);
  EXPECT_EQ(row_bytes(DType::Q4_K, 512), 288u);
  EXPECT_EQ(row_bytes(DType::Q6_K, 4096), 16u * 210);
  try {
    (void)row_bytes(DType::Q4_0, 33);
    FAIL() << "expected megakern::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("q4_0"), std::string::npos) << what;
    EXPECT_NE(what.find("33"), std::string::npos) << what;
  }
  try {
    (void)row_bytes(DType::Q6_K, 4000);
    FAIL() << "expected megakern::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("q6_k"), std::string::npos) << what;
    EXPECT_NE(what.find("4000"), std::string::npos) << what;
  }
  EXPECT_THROW((void)row_bytes(DType::Q4_K, 128), Error);
  EXPECT_EQ(row_bytes(DType::Q3_K, 512), 220u);
  EXPECT_EQ(row_bytes(DType::Q5_K, 256), 176u);
  EXPECT_EQ(row_bytes(DType::IQ4_NL, 64), 36u);
  EXPECT_EQ(row_bytes(DType::IQ4_XS, 768), 408u);
  EXPECT_THROW((void)row_bytes(DType::Q3_K, 288), Error);
  EXPECT_THROW((void)row_bytes(DType::IQ4_XS, 32), Error);
  EXPECT_THROW((void)row_bytes(DType::F16, -2), Error);
}

// ---------------------------------------------------------------------------
// Quantise -> dequantise round trips.

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> quantize(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_bytes(t, (int64_t)x.size()));
  dtype_traits(t).quantize(x.data(), q.data(), (int64_t)x.size());
  return q;
}

std::vector<float> dequantize(DType t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(n);
  dtype_traits(t).dequantize(q.data(), y.data(), n);
  return y;
}

// sqrt(sum (x - y)^2 / sum x^2).
double relative_rms(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    den += (double)x[i] * x[i];
  }
  return std::sqrt(num / den);
}

// Upper bounds on the relative RMS error of a quantise/dequantise round trip
// of Gaussian data, stated per format. Measured over 50 random 256-element
// rows (mean / worst): q8_0 0.0053 / 0.0061, q6_k 0.017 / 0.019, q5_0 0.042 /
// 0.049, q4_k 0.071 / 0.080, q4_1 0.078 / 0.088, q4_0 0.085 / 0.100. Each
// bound sits about 1.3x above the worst case, so a regression in a quantiser
// shows up while sampling noise does not. The f16/bf16 bounds are their
// half-ulp rounding error (2^-11, 2^-8), which bounds every element's
// relative error and hence the relative RMS; f32 is lossless. The newer
// formats, same measurement (mean / worst): mxfp4 0.114 / 0.139, fp8_e4m3
// 0.027 / 0.030, nvfp4 0.100 / 0.109, int4_g128 0.119 / 0.154, int8_col
// 0.0070 / 0.0091 (bounds ~1.3x the worst). Q3_K, Q5_K, IQ4_NL, IQ4_XS with
// our quantisers, same measurement: 0.143 / 0.155, 0.036 / 0.040, 0.073 /
// 0.083, 0.073 / 0.084.
double rms_bound(DType t) {
  switch (t) {
    case DType::F32: return 0.0;
    case DType::F16: return 0x1p-11;
    case DType::BF16: return 0x1p-8;
    case DType::Q8_0: return 0.008;
    case DType::Q6_K: return 0.025;
    case DType::Q5_0: return 0.065;
    case DType::Q4_K: return 0.10;
    case DType::Q4_1: return 0.115;
    case DType::Q4_0: return 0.13;
    case DType::MXFP4: return 0.18;
    case DType::FP8_E4M3: return 0.039;
    case DType::NVFP4: return 0.16;
    case DType::INT4_G128: return 0.20;
    case DType::INT8_COL: return 0.012;
    case DType::Q3_K: return 0.20;
    case DType::Q5_K: return 0.052;
    case DType::IQ4_NL: return 0.11;
    case DType::IQ4_XS: return 0.11;
  }
  return 0.0;
}

TEST(DTypeQuantize, RoundTripErrorIsBounded) {
  for (DType t : kAllTypes) {
    const DTypeTraits& tr = dtype_traits(t);
    for (int64_t n : {256, 768, 1024, 4096}) {
      for (float sigma : {1.0f, 0.02f, 40.0f}) {
        const auto x = gaussian((size_t)n, (uint32_t)(n * 31 + (int)t), sigma);
        const auto y = dequantize(t, quantize(t, x), n);
        const double err = relative_rms(x, y);
        EXPECT_LE(err, rms_bound(t)) << tr.name << " n=" << n << " sigma=" << sigma;
        // Bounded error on average must not hide a non-finite element.
        for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(y[i])) << tr.name << " i=" << i;
      }
    }
  }
}

TEST(DTypeQuantize, MixedScaleBlocksStayAccurate) {
  // Blocks whose magnitudes differ by up to six orders: each block must be
  // quantised against its own range, so the error relative to each block's
  // own RMS stays within the format's bound.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  for (DType t : kAllTypes) {
    // INT8_COL has one scale per row by design, so small blocks next to large
    // ones lose precision: not this property.
    if (t == DType::INT8_COL) continue;
    const DTypeTraits& tr = dtype_traits(t);
    const int64_t bs = std::max<int64_t>(tr.block_size, 32);
    const int64_t n = bs * 8;
    auto x = gaussian((size_t)n, 99);
    for (int64_t b = 0; b < n / bs; ++b) {
      const float s = std::pow(10.0f, exponent(rng));
      for (int64_t i = 0; i < bs; ++i) x[b * bs + i] *= s;
    }
    const auto y = dequantize(t, quantize(t, x), n);
    for (int64_t b = 0; b < n / bs; ++b) {
      const std::vector<float> xb(x.begin() + b * bs, x.begin() + (b + 1) * bs);
      const std::vector<float> yb(y.begin() + b * bs, y.begin() + (b + 1) * bs);
      // Single blocks are noisier than whole rows: allow 1.5x the row bound.
      EXPECT_LE(relative_rms(xb, yb), 1.5 * rms_bound(t)) << tr.name << " block " << b;
    }
  }
}

TEST(DTypeQuantize, SpecialBlocks) {
  for (DType t : kAllTypes) {
    const DTypeTraits& tr = dtype_traits(t);
    const int64_t n = std::max<int64_t>(tr.block_size, 32) * 2;
    // All zeros decodes to exact zeros.
    const std::vector<float> zeros((size_t)n, 0.0f);
    for (float v : dequantize(t, quantize(t, zeros), n)) ASSERT_EQ(v, 0.0f) << tr.name;
    // A constant block decodes close to the constant (every format has a
    // grid point within 2% of any single value: it is the block's extreme).
    for (float c : {0.75f, -3.0f}) {
      const std::vector<float> k((size_t)n, c);
      for (float v : dequantize(t, quantize(t, k), n)) ASSERT_NEAR(v, c, 0.02 * std::fabs(c)) << tr.name;
    }
    // Quantising writes every output byte (the result does not depend on
    // what the buffer held before) and treats blocks independently: two
    // blocks quantised in one call are the two quantised one at a time.
    const auto x = gaussian((size_t)n, 5);
    const size_t bytes = row_bytes(t, n);
    std::vector<uint8_t> zeroed(bytes, 0x00), filled(bytes, 0xff);
    tr.quantize(x.data(), zeroed.data(), n);
    tr.quantize(x.data(), filled.data(), n);
    EXPECT_EQ(zeroed, filled) << tr.name << ": some output bytes are left unwritten";
    if (t != DType::INT8_COL) {  // one scale for the whole row: not block-local
      const int64_t half = n / 2;
      ASSERT_EQ(half % tr.block_size, 0) << tr.name;
      std::vector<uint8_t> parts(bytes, 0x5a);
      const size_t half_bytes = row_bytes(t, half);
      tr.quantize(x.data(), parts.data(), half);
      tr.quantize(x.data() + half, parts.data() + half_bytes, half);
      EXPECT_EQ(parts, zeroed) << tr.name << ": blocks are not quantised independently";
    }
  }
}

// ---------------------------------------------------------------------------
// Dot products.

TEST(DTypeDot, MatchesF64SumOfDequantizedProducts) {
  for (DType t : kAllTypes) {
    const DTypeTraits& tr = dtype_traits(t);
    for (int64_t n : {256, 1024, 4096}) {
      const auto wf = gaussian((size_t)n, (uint32_t)n + 1);
      const auto x = gaussian((size_t)n, (uint32_t)n + 2, 3.0f);
      const auto w = quantize(t, wf);
      const auto wd = dequantize(t, w, n);
      double exact = 0, magnitude = 0;
      for (int64_t i = 0; i < n; ++i) {
        exact += (double)wd[i] * x[i];
        magnitude += std::fabs((double)wd[i] * x[i]);
      }
      const float got = tr.dot(w.data(), x.data(), n);
      // The dot rounds each product once, sums a chunk of k elements (one
      // block, or 32 floats), then adds n/k chunk sums, all in f32 with unit
      // roundoff u = 2^-24. Classical error analysis bounds the error by
      // about (1 + k + n/k) * u * sum|w*x|; we allow twice that.
      const double k = (double)std::max<int64_t>(tr.block_size, 32);
      const double tol = 2.0 * (1.0 + k + (double)n / k) * 0x1p-24 * magnitude;
      EXPECT_NEAR((double)got, exact, tol) << tr.name << " n=" << n;
      // Deterministic: the same inputs give the same bits.
      EXPECT_EQ(f32_to_bits(got), f32_to_bits(tr.dot(w.data(), x.data(), n))) << tr.name;
    }
    EXPECT_EQ(tr.dot(nullptr, nullptr, 0), 0.0f) << tr.name;
  }
}

TEST(DTypeDot, PlainFloatRowsOfAnyLength) {
  // Plain floats have no block constraint; rows that do not fill a whole
  // 32-element chunk must still be summed completely.
  for (int64_t n : {1, 5, 31, 33, 100}) {
    std::vector<float> w((size_t)n), x((size_t)n);
    double exact = 0;
    for (int64_t i = 0; i < n; ++i) {
      w[i] = (float)(i % 7) - 3.0f;
      x[i] = 0.5f * (float)(i % 5);
      exact += (double)w[i] * x[i];  // small integers and halves: exact in f32 too
    }
    EXPECT_EQ(dtype_traits(DType::F32).dot(w.data(), x.data(), n), (float)exact) << n;
    std::vector<uint16_t> wh((size_t)n), wb((size_t)n);
    for (int64_t i = 0; i < n; ++i) {
      wh[i] = f32_to_f16(w[i]);
      wb[i] = f32_to_bf16(w[i]);
    }
    EXPECT_EQ(dtype_traits(DType::F16).dot(wh.data(), x.data(), n), (float)exact) << n;
    EXPECT_EQ(dtype_traits(DType::BF16).dot(wb.data(), x.data(), n), (float)exact) << n;
  }
}

// ---------------------------------------------------------------------------
// Hand-built blocks with independently computed values.

void put_u16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = (uint8_t)(v & 0xff);
  b[at + 1] = (uint8_t)(v >> 8);
}

TEST(DTypeBlocks, PlainFloats) {
  const uint8_t f32_bytes[] = {0x00, 0x00, 0x60, 0x40, 0x00, 0x00, 0x80, 0xbf};  // 3.5f, -1.0f
  float y[2];
  dtype_traits(DType::F32).dequantize(f32_bytes, y, 2);
  EXPECT_EQ(y[0], 3.5f);
  EXPECT_EQ(y[1], -1.0f);

  // f16: 1.0, -2.0, 2^-24 (smallest subnormal), 65504 (largest), +inf.
  const uint8_t f16_bytes[] = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0xff, 0x7b, 0x00, 0x7c};
  float h[5];
  dtype_traits(DType::F16).dequantize(f16_bytes, h, 5);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 0x1p-24f);
  EXPECT_EQ(h[3], 65504.0f);
  EXPECT_EQ(h[4], std::numeric_limits<float>::infinity());

  // bf16: 1.0 (0x3f80), -123.5 (0xc2f7), 2^-133 (0x0001, an f32 subnormal).
  const uint8_t bf16_bytes[] = {0x80, 0x3f, 0xf7, 0xc2, 0x01, 0x00};
  float b[3];
  dtype_traits(DType::BF16).dequantize(bf16_bytes, b, 3);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -123.5f);
  EXPECT_EQ(b[2], 0x1p-133f);
}

TEST(DTypeBlocks, Q8_0) {
  std::vector<uint8_t> blk(34);
  put_u16(blk, 0, 0x3800);  // d = 0.5
  const int8_t q[32] = {-128, -127, -1, 0, 1, 2, 127, 100, -100, 5, 6, 7, 8, 9, 10, 11,
                        12,   13,   14, 15, 16, 17, 18, 19, -20, -21, -22, -23, -24, -25, -26, 64};
  std::memcpy(blk.data() + 2, q, 32);
  const auto y = dequantize(DType::Q8_0, blk, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.5f * q[i]) << i;
}

TEST(DTypeBlocks, Q4_0) {
  std::vector<uint8_t> blk(18);
  put_u16(blk, 0, 0x4000);  // d = 2.0
  for (int j = 0; j < 16; ++j) blk[2 + j] = (uint8_t)(j | ((15 - j) << 4));
  blk[2] = 0x9a;  // element 0 <- 0xa, element 16 <- 0x9
  const auto y = dequantize(DType::Q4_0, blk, 32);
  EXPECT_EQ(y[0], (10 - 8) * 2.0f);
  EXPECT_EQ(y[16], (9 - 8) * 2.0f);
  for (int j = 1; j < 16; ++j) {
    EXPECT_EQ(y[j], (float)(j - 8) * 2.0f) << j;            // low nibble of byte j
    EXPECT_EQ(y[16 + j], (float)(15 - j - 8) * 2.0f) << j;  // high nibble of byte j
  }
}

TEST(DTypeBlocks, Q4_1) {
  std::vector<uint8_t> blk(20);
  put_u16(blk, 0, 0x3400);  // d = 0.25
  put_u16(blk, 2, 0xbe00);  // m = -1.5
  for (int j = 0; j < 16; ++j) blk[4 + j] = (uint8_t)(((j * 5) & 15) | (((j * 3 + 1) & 15) << 4));
  const auto y = dequantize(DType::Q4_1, blk, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (float)((j * 5) & 15) * 0.25f - 1.5f) << j;
    EXPECT_EQ(y[16 + j], (float)((j * 3 + 1) & 15) * 0.25f - 1.5f) << j;
  }
}

TEST(DTypeBlocks, Q5_0) {
  // Element e's fifth bit is qh bit e, for all 32 elements; its low four bits
  // are the low nibble of qs[e] (e < 16) or the high nibble of qs[e - 16].
  std::vector<uint8_t> blk(22);
  put_u16(blk, 0, 0x3c00);  // d = 1.0
  const uint32_t qh = 0xa5c3'0f01u;
  blk[2] = (uint8_t)qh;
  blk[3] = (uint8_t)(qh >> 8);
  blk[4] = (uint8_t)(qh >> 16);
  blk[5] = (uint8_t)(qh >> 24);
  for (int j = 0; j < 16; ++j) blk[6 + j] = (uint8_t)((j & 15) | (((j + 7) & 15) << 4));
  const auto y = dequantize(DType::Q5_0, blk, 32);
  for (int e = 0; e < 32; ++e) {
    const int low = e < 16 ? (e & 15) : ((e - 16 + 7) & 15);
    const int q = low | (int)(((qh >> e) & 1u) << 4);
    EXPECT_EQ(y[e], (float)(q - 16)) << e;
  }
  // Spelled out: only qh bit 16 set, all nibbles zero -> element 16 is 0, the rest -16.
  std::vector<uint8_t> one(22, 0);
  put_u16(one, 0, 0x3c00);
  one[4] = 0x01;
  const auto z = dequantize(DType::Q5_0, one, 32);
  for (int e = 0; e < 32; ++e) EXPECT_EQ(z[e], e == 16 ? 0.0f : -16.0f) << e;
}

// Packs eight 6-bit (scale, min) pairs as the Q4_K layout describes: bytes
// 0..3 = sc[0..3] | top two bits of sc[4..7] in bits 6..7; bytes 4..7 = m[0..3]
// | top two bits of m[4..7]; bytes 8..11 = low nibble sc[4..7] | low nibble
// m[4..7] << 4.
std::array<uint8_t, 12> pack_q4_k_scales(const int sc[8], const int m[8]) {
  std::array<uint8_t, 12> s{};
  for (int i = 0; i < 4; ++i) {
    s[i] = (uint8_t)(sc[i] | ((sc[i + 4] >> 4) << 6));
    s[4 + i] = (uint8_t)(m[i] | ((m[i + 4] >> 4) << 6));
    s[8 + i] = (uint8_t)((sc[i + 4] & 15) | ((m[i + 4] & 15) << 4));
  }
  return s;
}

TEST(DTypeBlocks, Q4_KScalesAndNibbles) {
  const int sc[8] = {1, 17, 33, 63, 5, 40, 22, 59};
  const int mn[8] = {63, 2, 31, 16, 48, 7, 60, 33};
  // Worked by hand from the layout (see pack_q4_k_scales), to check the helper itself.
  const std::array<uint8_t, 12> packed = {0x01, 0x91, 0x61, 0xff, 0xff, 0x02, 0xdf, 0x90, 0x05, 0x78, 0xc6, 0x1b};
  ASSERT_EQ(pack_q4_k_scales(sc, mn), packed);

  std::vector<uint8_t> blk(144);
  put_u16(blk, 0, 0x3800);  // d = 0.5
  put_u16(blk, 2, 0x3400);  // dmin = 0.25
  std::memcpy(blk.data() + 4, packed.data(), 12);
  std::mt19937 rng(3);
  for (int i = 0; i < 128; ++i) blk[16 + i] = (uint8_t)rng();
  const auto y = dequantize(DType::Q4_K, blk, 256);
  for (int e = 0; e < 256; ++e) {
    // Element e: 64-element chunk c = e / 64 reads qs[32c + e % 32], low
    // nibble in the chunk's first 32 elements, high nibble in its second 32.
    const int c = e / 64, r = e % 64;
    const uint8_t byte = blk[16 + 32 * c + r % 32];
    const int q = r < 32 ? (byte & 15) : (byte >> 4);
    const int sub = e / 32;
    const double expected = 0.5 * sc[sub] * q - 0.25 * mn[sub];  // exact in f32
    EXPECT_EQ(y[e], (float)expected) << "element " << e << " sub-block " << sub;
  }
  // Each sub-block alone: all nibbles 1 -> d*sc - dmin*m, which identifies
  // the unpacked scale and min of sub-blocks 0..7 individually.
  std::fill(blk.begin() + 16, blk.end(), 0x11);
  const auto ones = dequantize(DType::Q4_K, blk, 256);
  for (int sub = 0; sub < 8; ++sub) {
    for (int l = 0; l < 32; ++l) EXPECT_EQ(ones[32 * sub + l], 0.5f * sc[sub] - 0.25f * mn[sub]) << sub;
  }
}

TEST(DTypeBlocks, Q4_KEveryScaleValue) {
  // Every 6-bit value in every sub-block position, scales and mins
  // independently, with nibbles all 1 so element value = sc - m / 64.
  for (int v = 0; v < 64; ++v) {
    for (int sub = 0; sub < 8; ++sub) {
      int sc[8], mn[8];
      for (int i = 0; i < 8; ++i) {
        sc[i] = (v + 11 * i) % 64;
        mn[i] = (63 - v + 5 * i) % 64;
      }
      sc[sub] = v;
      const auto packed = pack_q4_k_scales(sc, mn);
      std::vector<uint8_t> blk(144, 0x11);
      put_u16(blk, 0, 0x3c00);  // d = 1
      put_u16(blk, 2, 0x2400);  // dmin = 1/64
      std::memcpy(blk.data() + 4, packed.data(), 12);
      const auto y = dequantize(DType::Q4_K, blk, 256);
      for (int i = 0; i < 8; ++i) ASSERT_EQ(y[32 * i], (float)sc[i] - (float)mn[i] / 64.0f) << v << " " << i;
    }
  }
}

TEST(DTypeBlocks, Q6_KInterleaving) {
  // Place a chosen 6-bit quant q[e] for every element following the layout:
  // half h = e / 128; within it g = (e % 128) / 32 and l = e % 32; the low
  // four bits go to ql[64h + l + 32*(g % 2)] (low nibble for g < 2, high
  // nibble otherwise), the high two bits to bits 2g..2g+1 of qh[32h + l].
  std::mt19937 rng(11);
  int q[256];
  for (int& v : q) v = (int)(rng() % 64);
  std::vector<uint8_t> blk(210, 0);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, g = (e % 128) / 32, l = e % 32;
    blk[64 * h + l + 32 * (g % 2)] |= (uint8_t)((q[e] & 15) << (g < 2 ? 0 : 4));
    blk[128 + 32 * h + l] |= (uint8_t)((q[e] >> 4) << (2 * g));
  }
  const int8_t scales[16] = {-128, 127, 1, -1, 2, -3, 5, -8, 13, -21, 34, -55, 89, 100, -100, 0};
  std::memcpy(blk.data() + 192, scales, 16);
  put_u16(blk, 208, 0x3000);  // d = 0.125
  const auto y = dequantize(DType::Q6_K, blk, 256);
  for (int e = 0; e < 256; ++e) {
    const double expected = 0.125 * scales[e / 16] * (q[e] - 32);  // exact in f32
    EXPECT_EQ(y[e], (float)expected) << "element " << e;
  }

  // Spelled out: ql[0] = 0x21, ql[32] = 0x43, qh[0] = 0b11'10'01'00, other
  // quant bytes zero, all scales 1, d = 1. Element 0 = 0x1 | 0<<4 = 1;
  // element 32 = 0x3 | 1<<4 = 19; element 64 = 0x2 | 2<<4 = 34; element 96 =
  // 0x4 | 3<<4 = 52; every other element has q = 0. Values are q - 32.
  std::vector<uint8_t> lit(210, 0);
  lit[0] = 0x21;
  lit[32] = 0x43;
  lit[128] = 0xe4;
  for (int i = 0; i < 16; ++i) lit[192 + i] = 1;
  put_u16(lit, 208, 0x3c00);
  const auto z = dequantize(DType::Q6_K, lit, 256);
  for (int e = 0; e < 256; ++e) {
    const float expected = e == 0 ? -31.0f : e == 32 ? -13.0f : e == 64 ? 2.0f : e == 96 ? 20.0f : -32.0f;
    EXPECT_EQ(z[e], expected) << e;
  }
}

// ---------------------------------------------------------------------------
// Cross-check against the gguf Python package (scripts/fixtures/gen_dtype_fixture.py).

std::vector<uint8_t> from_hex(const std::string& s) {
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = (uint8_t)std::stoi(s.substr(2 * i, 2), nullptr, 16);
  return out;
}

float json_float(const nlohmann::json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "inf") return std::numeric_limits<float>::infinity();
    if (s == "-inf") return -std::numeric_limits<float>::infinity();
    return std::numeric_limits<float>::quiet_NaN();
  }
  // Finite values are written as the exact f32 value, so the double parses
  // exactly and converts to f32 without rounding.
  return (float)v.get<double>();
}

TEST(DTypeFixture, MatchesGgufPackageBitExactly) {
  const std::string path = std::string(MEGAKERN_SOURCE_DIR) + "/tests/fixtures/dtype_blocks.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing fixture " << path << " (regenerate with scripts/fixtures/gen_dtype_fixture.py)";
  const nlohmann::json doc = nlohmann::json::parse(in);
  const auto& formats = doc.at("formats");
  int checked = 0;
  for (const std::string name : {"q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k", "f16", "bf16", "q3_k", "q5_k",
                                 "iq4_nl", "iq4_xs", "q3_k_ours", "q5_k_ours", "iq4_nl_ours", "iq4_xs_ours"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(formats.contains(name));
    const auto& f = formats.at(name);
    // "<format>_ours": blocks written by our quantiser, decoded by gguf.
    const size_t ours = name.rfind("_ours");
    const auto t = dtype_from_name(ours == std::string::npos ? name : name.substr(0, ours));
    ASSERT_TRUE(t.has_value());
    const auto bytes = from_hex(f.at("hex").get<std::string>());
    const auto& values = f.at("values");
    const int64_t n = (int64_t)values.size();
    ASSERT_EQ(bytes.size(), row_bytes(*t, n));

    // Dequantisation must be bit-exact: our f32 arithmetic follows ggml's
    // operation order, which the gguf package reproduces in numpy f32.
    const auto y = dequantize(*t, bytes, n);
    for (int64_t i = 0; i < n; ++i) {
      const float want = json_float(values[(size_t)i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(y[i])) << "element " << i;
      } else {
        EXPECT_EQ(f32_to_bits(y[i]), f32_to_bits(want)) << "element " << i << ": got " << y[i] << " want " << want;
      }
    }
    // Where gguf quantised the input itself, our reference quantiser must
    // write the same bytes (gguf mirrors ggml's reference quantisers). For
    // the "_ours" entries the bytes came from our quantiser when the fixture
    // was made, so this pins its output.
    if (f.contains("input")) {
      std::vector<float> x;
      for (const auto& v : f.at("input")) x.push_back(json_float(v));
      ASSERT_EQ((int64_t)x.size(), n);
      EXPECT_EQ(quantize(*t, x), bytes);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 16);
}

}  // namespace
}  // namespace megakern

namespace megakern {
namespace {

// ---------------------------------------------------------------------------
// The newer formats, block by block from their documented layouts.

TEST(DTypeBlocks, Fp8E4M3MatchesDefinitionExhaustively) {
  for (int b = 0; b < 256; ++b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const float got = fp8_e4m3_to_f32((uint8_t)b);
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    // (-1)^s * 2^(e-7) * (1 + m/8), or 2^-6 * m/8 for e = 0: exact in double.
    const double mag = e == 0 ? std::ldexp((double)m, -9) : std::ldexp(8.0 + m, e - 10);
    EXPECT_EQ(got, (float)((b & 0x80) ? -mag : mag)) << b;
    // And back, exactly (every finite code round-trips; -0 keeps its sign).
    EXPECT_EQ(f32_to_fp8_e4m3(got), (uint8_t)b) << b;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_fp8_e4m3(1e6f), 0x7e);    // saturates
  EXPECT_EQ(f32_to_fp8_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(1.0625f), 0x38);  // tie between 1 and 1.125 -> even (1.0)
  EXPECT_EQ(f32_to_fp8_e4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25 -> even (1.25)
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-10f), 0x00); // half the smallest subnormal -> 0 (even)
  EXPECT_EQ(f32_to_fp8_e4m3(3 * 0x1p-11f), 0x01);
}

TEST(DTypeBlocks, Mxfp4) {
  // GGML block_mxfp4: e, then qs[16]; element j < 16 = low nibble of qs[j],
  // j + 16 = high nibble; value = e2m1(code) * 2^(e-127).
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int e : {0, 1, 2, 120, 127, 130, 254}) {
    std::vector<uint8_t> blk(17);
    blk[0] = (uint8_t)e;
    for (int j = 0; j < 16; ++j) blk[1 + j] = (uint8_t)((j & 15) | (((j * 7 + 3) & 15) << 4));
    const auto y = dequantize(DType::MXFP4, blk, 32);
    const double scale = std::ldexp(1.0, e - 127);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], (float)(e2m1[j] * scale)) << e << " " << j;
      EXPECT_EQ(y[16 + j], (float)(e2m1[(j * 7 + 3) & 15] * scale)) << e << " " << j;
    }
  }
  // Quantising the grid itself is lossless: block max 6 * 2^-3 -> e = 124.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = e2m1[j % 16] * 0.125f;
  x[7] = 6 * 0.125f;
  const auto q = quantize(DType::MXFP4, x);
  EXPECT_EQ(q[0], 124);
  const auto back = dequantize(DType::MXFP4, q, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(back[j], x[j]) << j;
}

TEST(DTypeBlocks, Fp8Block) {
  // e8m0 scale byte then 32 e4m3 bytes; value = fp8 * 2^(e-127).
  std::vector<uint8_t> blk(33);
  blk[0] = 125;  // 2^-2
  for (int j = 0; j < 32; ++j) blk[1 + j] = (uint8_t)(j * 8 + (j % 7));  // no NaN code
  blk[1 + 15] = 0x7e;  // 448
  const auto y = dequantize(DType::FP8_E4M3, blk, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], fp8_e4m3_to_f32(blk[1 + j]) * 0.25f) << j;
  EXPECT_EQ(y[15], 112.0f);
  // The quantiser picks the smallest power of two that fits the maximum.
  std::vector<float> x(32, 1.0f);
  x[3] = -900.0f;  // needs 2^1: 900 / 2 = 450 > 448 -> 2^2
  const auto q = quantize(DType::FP8_E4M3, x);
  EXPECT_EQ(q[0], 127 + 2);
  EXPECT_EQ(dequantize(DType::FP8_E4M3, q, 32)[3], -896.0f);  // 224 * 4, nearest to 225
}

TEST(DTypeBlocks, Nvfp4) {
  // 4 unsigned e4m3 scales, then sub-block s's 8 bytes qs[8s..8s+7]: low
  // nibbles elements 16s+0..7, high nibbles 16s+8..15; value = e2m1 * scale.
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  std::vector<uint8_t> blk(36);
  const uint8_t scales[4] = {0x38, 0x01, 0x7f, 0x45};  // 1.0, 2^-9, NaN code (-> 0), 2^1 * 1.625
  const float scale_val[4] = {1.0f, 0x1p-9f, 0.0f, 3.25f};
  std::memcpy(blk.data(), scales, 4);
  std::mt19937 rng(5);
  for (int i = 0; i < 32; ++i) blk[4 + i] = (uint8_t)rng();
  const auto y = dequantize(DType::NVFP4, blk, 64);
  for (int e = 0; e < 64; ++e) {
    const int s = e / 16, r = e % 16;
    const uint8_t byte = blk[4 + 8 * s + r % 8];
    const int code = r < 8 ? (byte & 15) : (byte >> 4);
    EXPECT_EQ(y[e], e2m1[code] * scale_val[s]) << e;
  }
}

TEST(DTypeBlocks, Int4G128) {
  // f16 d, then 4 groups of 16 bytes; group g: low nibbles elements
  // 32g+0..15, high nibbles 32g+16..31; value = (code - 8) * d.
  std::vector<uint8_t> blk(66);
  put_u16(blk, 0, 0x3400);  // 0.25
  std::mt19937 rng(9);
  for (int i = 0; i < 64; ++i) blk[2 + i] = (uint8_t)rng();
  const auto y = dequantize(DType::INT4_G128, blk, 128);
  for (int e = 0; e < 128; ++e) {
    const int g = e / 32, r = e % 32;
    const uint8_t byte = blk[2 + 16 * g + r % 16];
    const int code = r < 16 ? (byte & 15) : (byte >> 4);
    EXPECT_EQ(y[e], (float)(code - 8) * 0.25f) << e;
  }
  // Quantiser: d = absmax / 7 (f16), round half to even, clip to -8..7.
  std::vector<float> x(128, 0.0f);
  x[0] = 7.0f;    // d = 1
  x[1] = 2.5f;    // tie -> 2
  x[2] = 3.5f;    // tie -> 4
  x[3] = -7.0f;
  x[4] = -2.5f;   // -> -2
  const auto q = quantize(DType::INT4_G128, x);
  const auto back = dequantize(DType::INT4_G128, q, 128);
  EXPECT_EQ(back[0], 7.0f);
  EXPECT_EQ(back[1], 2.0f);
  EXPECT_EQ(back[2], 4.0f);
  EXPECT_EQ(back[3], -7.0f);
  EXPECT_EQ(back[4], -2.0f);
}

TEST(DTypeBlocks, Int8ColUsesOneScalePerRow) {
  // f32 d then 128 int8 per block; the quantiser gives every block of the
  // row it is handed the row's absmax / 127.
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[i] = (float)(i % 11) - 5.0f;
  x[200] = 127.0f;  // row absmax in the second block -> d = 1 everywhere
  const auto q = quantize(DType::INT8_COL, x);
  ASSERT_EQ(q.size(), 2u * 132);
  float d0, d1;
  std::memcpy(&d0, q.data(), 4);
  std::memcpy(&d1, q.data() + 132, 4);
  EXPECT_EQ(d0, 1.0f);
  EXPECT_EQ(d1, 1.0f);
  const auto y = dequantize(DType::INT8_COL, q, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], x[i]) << i;  // integers: exact
  EXPECT_EQ((int8_t)q[4 + 3], -2);
}

// Q3_K from its documented layout: d = 1, every 6-bit scale 33 (+1) except
// scale 10 (elements 160..175) at 30 (-2); all quants -4 except element 0
// (low bits 3, high bit set: 3) and element 167 (half 1, group 1, l = 7:
// low bits 2 in bits 2..3 of qs[32 + 7], high bit 5 of hmask[7] clear: -2).
TEST(DTypeBlocks, Q3_KLayout) {
  std::vector<uint8_t> b(110, 0);
  for (int i = 0; i < 8; ++i) b[96 + i] = 0x11;    // low nibbles of scales 0..15: 1
  for (int i = 8; i < 12; ++i) b[96 + i] = 0xAA;   // top two bits of every scale: 2
  b[96 + 2] = 0xE1;                                 // scale 10's low nibble 0xE (scale 2 keeps 1)
  b[96 + 10] = 0x9A;                                // scale 10's top bits (4..5 of byte 10): 1
  put_u16(b, 108, 0x3c00);
  b[32] = 0x03;
  b[0] = 0x01;
  b[32 + 32 + 7] = 0x02 << 2;
  const auto y = dequantize(DType::Q3_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const float sc = e >= 160 && e < 176 ? -2.0f : 1.0f;
    const float q = e == 0 ? 3.0f : e == 167 ? -2.0f : -4.0f;
    EXPECT_EQ(y[e], sc * q) << e;
  }
}

// IQ4_XS from its documented layout: d = 0.5, every 6-bit scale 34 (+2)
// except sub-block 5 at 0 (-32); every byte of qs 0x80 (index 0 = -127 for
// elements 0..15 of a sub-block, index 8 = +1 for 16..31).
TEST(DTypeBlocks, Iq4XsLayout) {
  std::vector<uint8_t> b(136, 0x80);
  put_u16(b, 0, 0x3800);
  put_u16(b, 2, 0xA2AA);  // high bits 2 everywhere but sub-block 5 (bits 10..11)
  for (int i = 0; i < 4; ++i) b[4 + i] = 0x22;
  b[4 + 2] = 0x02;  // sub-block 5 = high nibble of scales_l[2]
  const auto y = dequantize(DType::IQ4_XS, b, 256);
  for (int e = 0; e < 256; ++e) {
    const float sc = e / 32 == 5 ? -16.0f : 1.0f;  // 0.5 * (ls - 32)
    EXPECT_EQ(y[e], sc * (e % 32 < 16 ? -127.0f : 1.0f)) << e;
  }
  // IQ4_NL: the same table in a 32-element block with a plain f16 scale.
  std::vector<uint8_t> nl(18);
  put_u16(nl, 0, 0xbc00);  // -1
  for (int j = 0; j < 16; ++j) nl[2 + j] = (uint8_t)(j | ((15 - j) << 4));
  const int8_t table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  const auto z = dequantize(DType::IQ4_NL, nl, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(z[j], -(float)table[j]) << j;
    EXPECT_EQ(z[16 + j], -(float)table[15 - j]) << j;
  }
}

// Q5_K: Q4_K's nibbles and scales with element l of sub-block sb taking bit
// sb of qh[l]. d = 1, dmin = 0.5, every scale 1 and min 2 (-1): a zero
// nibble with its fifth bit set decodes to 16 - 1.
TEST(DTypeBlocks, Q5_KFifthBit) {
  std::vector<uint8_t> b(176, 0);
  put_u16(b, 0, 0x3c00);
  put_u16(b, 2, 0x3800);
  for (int i = 0; i < 4; ++i) {
    b[4 + i] = 1;         // scales 0..3
    b[8 + i] = 2;         // mins 0..3
    b[12 + i] = 0x21;     // scales / mins 4..7 (low four bits)
  }
  b[16 + 9] = 1 << 6;     // element 9 of sub-block 6
  b[48 + 32 * 1 + 4] = 0x70;  // sub-block 3 (odd: high nibble), element 4: 7
  const auto y = dequantize(DType::Q5_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const float want = e == 6 * 32 + 9 ? 15.0f : e == 3 * 32 + 4 ? 6.0f : -1.0f;
    EXPECT_EQ(y[e], want) << e;
  }
}

}  // namespace
}  // namespace megakern
