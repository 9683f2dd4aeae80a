// KV caches of f16, bf16 and q8_0 (core/kv_type.h): what store() writes is
// the rounding or quantisation the type defines, load() and the kernels'
// decoders give back exactly those values, every decoder build gives the
// scalar one's floats, the attention kernels over a typed cache match their
// row-by-row definition and the same kernels over an f32 cache of the
// decoded values bit for bit, and bad types and widths are refused by name.
// (The executors' guarantees for each type: test_exec.cpp's ExecArchTest,
// test_muse.cpp's MuseKvTest, test_kimi.cpp's KimiKvTest.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype_blocks.h"
#include "core/error.h"
#include "core/half.h"
#include "core/rng.h"
#include "ir/sequence_state.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv_decode.h"
#include "test_util.h"

namespace megakern {
namespace {

// One head's row of n values of x as type t stores it (the definition).
std::vector<uint8_t> encode(KvType t, const float* x, int n) {
  std::vector<uint8_t> b(kv_row_bytes(t, n));
  for (int i = 0; i < n; ++i) {
    if (t == KvType::f16) dtype_detail::store_u16(&b[2 * static_cast<size_t>(i)], f32_to_f16(x[i]));
    if (t == KvType::bf16) dtype_detail::store_u16(&b[2 * static_cast<size_t>(i)], f32_to_bf16(x[i]));
  }
  if (t == KvType::q8_0)
    for (int i = 0; i < n; i += 32) dtype_detail::quant_q8_0(x + i, &b[static_cast<size_t>(i / 32) * 34]);
  return b;
}

// The value a stored row holds at i (the definition of the read).
float decoded(KvType t, const uint8_t* b, int i) {
  if (t == KvType::q8_0) {
    const uint8_t* blk = b + static_cast<size_t>(i / 32) * 34;
    return static_cast<float>(static_cast<int8_t>(blk[2 + i % 32])) * dtype_detail::load_f16(blk);
  }
  const uint16_t h = dtype_detail::load_u16(b + 2 * i);
  return t == KvType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

TEST(KvType, NamesAndBytesPerValue) {
  for (KvType t : {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0}) {
    ASSERT_TRUE(kv_type_from_name(kv_type_name(t)).has_value());
    EXPECT_EQ(*kv_type_from_name(kv_type_name(t)), t);
  }
  EXPECT_FALSE(kv_type_from_name("q4").has_value());
  EXPECT_FALSE(kv_type_from_name("F16").has_value());
  EXPECT_EQ(kv_row_bytes(KvType::f32, 64), 256u);
  EXPECT_EQ(kv_row_bytes(KvType::f16, 64), 128u);
  EXPECT_EQ(kv_row_bytes(KvType::bf16, 64), 128u);
  EXPECT_EQ(kv_row_bytes(KvType::q8_0, 64), 68u);
}

// A cache of 2 layers (one a ring), 2 KV heads of 64 (V 32 wide, as MLA's).
SequenceShape small_shape() {
  SequenceShape s;
  s.kv_layers = 2;
  s.kv_dim = 128;
  s.v_dim = 64;
  s.kv_heads = 2;
  s.window = {0, 4};
  s.head_k = {64, 64};
  s.head_v = {32, 32};
  return s;
}

TEST(KvCache, StoreRoundsOrQuantisesAndLoadGivesTheStoredValues) {
  for (KvType t : {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0}) {
    SCOPED_TRACE(kv_type_name(t));
    SequenceState s = make_sequence_state(small_shape(), 16, /*ring_block=*/2, t);
    KVCache& c = s.cache;
    ASSERT_EQ(c.type, t);
    // Layer 0 keeps 16 positions, layer 1 a ring of 4 + 2 - 1.
    EXPECT_EQ(c.k_values(), static_cast<size_t>(16 + 5) * 128);
    EXPECT_EQ(c.v_values(), static_cast<size_t>(16 + 5) * 64);
    EXPECT_EQ(c.bytes(), (16 + 5) * (kv_row_bytes(t, 128) + kv_row_bytes(t, 64)));
    EXPECT_EQ(t == KvType::f32, !c.k.empty());
    EXPECT_EQ(t == KvType::f32, c.kq.empty());
    Rng rng(11);
    std::vector<float> kr(128), vr(64), kb(128), vb(64);
    for (int layer : {0, 1})
      for (int pos : {0, 3, 7, 12}) {
        for (float& x : kr) x = 3.f * rng.symmetric();
        for (float& x : vr) x = 0.01f * rng.symmetric();
        kr[5] = 0.f, kr[70] = 1e-30f, vr[9] = -70000.f;  // zero, an underflow, an f16 overflow
        c.store(layer, pos, kr.data(), vr.data());
        c.load(layer, pos, kb.data(), vb.data());
        if (t == KvType::f32) {
          EXPECT_TRUE(same_bits(kb.data(), kr.data(), 128));
          EXPECT_TRUE(same_bits(vb.data(), vr.data(), 64));
          continue;
        }
        for (int h = 0; h < 2; ++h) {
          const std::vector<uint8_t> ek = encode(t, kr.data() + 64 * h, 64), ev = encode(t, vr.data() + 32 * h, 32);
          // The bytes stored where head h's position lives, and the values read back.
          const uint8_t* sk = c.k_head_bytes(layer, h) + c.slot(layer, pos) * kv_row_bytes(t, 64);
          const uint8_t* sv = c.v_head_bytes(layer, h) + c.slot(layer, pos) * kv_row_bytes(t, 32);
          ASSERT_EQ(0, std::memcmp(sk, ek.data(), ek.size())) << "layer " << layer << " pos " << pos << " head " << h;
          ASSERT_EQ(0, std::memcmp(sv, ev.data(), ev.size())) << "layer " << layer << " pos " << pos << " head " << h;
          for (int i = 0; i < 64; ++i) ASSERT_EQ(f32_to_bits(kb[64 * h + i]), f32_to_bits(decoded(t, ek.data(), i)));
          for (int i = 0; i < 32; ++i) ASSERT_EQ(f32_to_bits(vb[32 * h + i]), f32_to_bits(decoded(t, ev.data(), i)));
        }
        // The rounding is to nearest (even): within half a unit of the type.
        const double rel = t == KvType::f16 ? 1.0 / 2048 : t == KvType::bf16 ? 1.0 / 256 : 0.0;
        if (rel > 0)
          for (int i = 0; i < 128; ++i)
            if (std::fabs(kr[i]) > 1e-4f) ASSERT_LE(std::fabs(kb[i] - kr[i]), rel * std::fabs(kr[i]) * 1.0001) << i;
        if (t == KvType::q8_0)  // half a step of amax / 127, plus 127 steps' share of the f16 scale's rounding
          for (int b = 0; b < 4; ++b) {
            float amax = 0;
            for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(kr[32 * b + i]));
            for (int i = 0; i < 32; ++i) ASSERT_LE(std::fabs(kb[32 * b + i] - kr[32 * b + i]), amax / 127 * (0.5f + 127.f / 2048));
          }
        if (t == KvType::f16) EXPECT_TRUE(std::isinf(vb[9]));
      }
  }
}

TEST(KvCache, Q8NeedsHeadsOfWholeBlocks) {
  SequenceShape s = small_shape();
  s.kv_dim = 96;  // heads of 48
  s.head_k = {48, 48};
  EXPECT_NO_THROW(make_sequence_state(s, 8, 0, KvType::f16));
  try {
    make_sequence_state(s, 8, 0, KvType::q8_0);
    FAIL() << "q8_0 with heads of 48 was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("KV layer 0 has heads of 48 (keys) / 32 (values)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("blocks of 32"), std::string::npos) << msg;
  }
  // An attention that reads a position-major cache's row in heads of 16.
  SequenceShape p = small_shape();
  p.kv_heads = 1;
  p.head_k = {64, 16};
  EXPECT_THROW(check_kv_type(p, KvType::q8_0), Error);
  p.head_k = {64, 64};
  EXPECT_NO_THROW(check_kv_type(p, KvType::q8_0));
}

// Every f16 and bf16 bit pattern a store can write (all but the signalling
// NaNs, which f32_to_f16 never produces) and q8_0 blocks of every int8 with
// scales from subnormal to the largest half: the AVX2 / F16C decoder gives
// the scalar decoder's floats, over padded strides and odd widths.
TEST(Kernels, KvDecodeBuildsMatchTheScalarDecoder) {
  if (!use_avx2() || !cpu_features().f16c) GTEST_SKIP() << "no AVX2 / F16C here (or MEGAKERN_ISA=scalar)";
  for (KvType t : {KvType::f16, KvType::bf16}) {
    std::vector<uint16_t> all;
    for (uint32_t h = 0; h < 65536; ++h) {
      const bool snan = t == KvType::f16 ? (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0 && !(h & 0x200u)
                                         : (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0 && !(h & 0x40u);
      if (!snan) all.push_back(static_cast<uint16_t>(h));
    }
    for (int n : {37, 64, 8}) {
      const int64_t stride = 2 * n + 6;
      const int64_t rows = static_cast<int64_t>(all.size()) / n;
      std::vector<uint8_t> src(static_cast<size_t>(rows * stride), 0xab);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(&src[static_cast<size_t>(r * stride)], &all[static_cast<size_t>(r * n)], 2 * static_cast<size_t>(n));
      std::vector<float> a(static_cast<size_t>(rows * n)), b(a.size());
      kv_decode_rows_scalar(t, src.data(), stride, rows, n, a.data());
      kv_decode_rows_avx2(t, src.data(), stride, rows, n, b.data());
      ASSERT_TRUE(same_bits(a.data(), b.data(), a.size())) << kv_type_name(t) << " width " << n;
    }
  }
  Rng rng(5);
  const int n = 96, rows = 300;
  const int64_t stride = static_cast<int64_t>(kv_row_bytes(KvType::q8_0, n)) + 10;
  std::vector<uint8_t> src(static_cast<size_t>(rows * stride));
  for (int r = 0; r < rows; ++r)
    for (int blk = 0; blk < n / 32; ++blk) {
      uint8_t* p = &src[static_cast<size_t>(r * stride + blk * 34)];
      const uint16_t d = static_cast<uint16_t>((r * 3 + blk) % 0x7c00);  // every finite exponent
      dtype_detail::store_u16(p, d);
      for (int j = 0; j < 32; ++j) p[2 + j] = static_cast<uint8_t>((r * 32 + j * 7 + blk) & 0xff);
    }
  std::vector<float> a(static_cast<size_t>(rows * n)), b(a.size());
  kv_decode_rows_scalar(KvType::q8_0, src.data(), stride, rows, n, a.data());
  kv_decode_rows_avx2(KvType::q8_0, src.data(), stride, rows, n, b.data());
  ASSERT_TRUE(same_bits(a.data(), b.data(), a.size()));
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(f32_to_bits(a[static_cast<size_t>(r * n + i)]),
                f32_to_bits(decoded(KvType::q8_0, &src[static_cast<size_t>(r * stride)], i)));
}

struct Case {
  int head_dim, v_dim, n_heads, n_rows, pos0, window, ring;
};

// Keys and values of 2 KV heads stored as type t, position-major (padded
// strides, the view is the second head) and head-major; the tiled kernel
// over them against its row-by-row definition, against the same kernel over
// f32 caches of the decoded values, and each row alone: all the same bits.
void check_typed(KvType t, const Case& c, bool scalar) {
  SCOPED_TRACE(::testing::Message() << kv_type_name(t) << " hd " << c.head_dim << " vd " << c.v_dim << " heads "
                                    << c.n_heads << " rows " << c.n_rows << " pos0 " << c.pos0 << " window "
                                    << c.window << " ring " << c.ring << (scalar ? " scalar" : " vector"));
  const int n_kv = 2, last = c.pos0 + c.n_rows - 1, slots = c.ring > 0 ? c.ring : last + 1;
  const int64_t kr = static_cast<int64_t>(kv_row_bytes(t, n_kv * c.head_dim)) + 6;
  const int64_t vr = static_cast<int64_t>(kv_row_bytes(t, n_kv * c.v_dim)) + 10;
  std::vector<uint8_t> kb(static_cast<size_t>(slots * kr)), vb(static_cast<size_t>(slots * vr));
  std::vector<uint8_t> khm, vhm;  // head-major: the second head's rows back to back
  std::vector<float> kf(static_cast<size_t>(slots * c.head_dim)), vf(static_cast<size_t>(slots * c.v_dim));
  Rng rng(static_cast<uint64_t>(c.head_dim * 31 + c.n_rows + c.pos0 * 3 + static_cast<int>(t)));
  std::vector<float> row(static_cast<size_t>(std::max(c.head_dim, c.v_dim)));
  for (int s = 0; s < slots; ++s)
    for (int h = 0; h < n_kv; ++h)
      for (bool values : {false, true}) {
        const int w = values ? c.v_dim : c.head_dim;
        for (int i = 0; i < w; ++i) row[static_cast<size_t>(i)] = 2.f * rng.symmetric();
        const std::vector<uint8_t> e = encode(t, row.data(), w);
        std::vector<uint8_t>& buf = values ? vb : kb;
        std::memcpy(&buf[static_cast<size_t>(s * (values ? vr : kr)) + kv_row_bytes(t, h * w)], e.data(), e.size());
        if (h != 1) continue;
        (values ? vhm : khm).insert((values ? vhm : khm).end(), e.begin(), e.end());
        float* f = (values ? vf.data() : kf.data()) + static_cast<size_t>(s * w);
        for (int i = 0; i < w; ++i) f[i] = decoded(t, e.data(), i);
      }
  const int64_t qs = int64_t{c.n_heads} * c.head_dim + 1, os = int64_t{c.n_heads} * c.v_dim + 2;
  std::vector<float> q(static_cast<size_t>(c.n_rows * qs));
  for (float& x : q) x = rng.symmetric();
  KvHeadView pm;
  pm.type = t;
  pm.kb = kb.data() + kv_row_bytes(t, c.head_dim);
  pm.vb = vb.data() + kv_row_bytes(t, c.v_dim);
  pm.k_stride = kr;
  pm.v_stride = vr;
  pm.ring = c.ring;
  KvHeadView hm = pm;
  hm.kb = khm.data();
  hm.vb = vhm.data();
  hm.k_stride = static_cast<int64_t>(kv_row_bytes(t, c.head_dim));
  hm.v_stride = static_cast<int64_t>(kv_row_bytes(t, c.v_dim));
  KvHeadView f32;
  f32.k = kf.data();
  f32.v = vf.data();
  f32.k_stride = c.head_dim;
  f32.v_stride = c.v_dim;
  f32.ring = c.ring;
  AttentionBlock a;
  a.q = q.data();
  a.q_stride = qs;
  a.out_stride = os;
  a.n_rows = c.n_rows;
  a.pos0 = c.pos0;
  a.n_heads = c.n_heads;
  a.head_dim = c.head_dim;
  a.v_dim = c.v_dim;
  a.window = c.window;
  a.scale = 0.29f;
  auto run = [&](const KvHeadView& kv, bool reference) {
    std::vector<float> out(static_cast<size_t>(c.n_rows * os), -7.f);
    AttentionBlock b = a;
    b.out = out.data();
    if (reference)
      attention_rows_reference(b, kv, scalar);
    else
      attention_block(b, kv, scalar);
    return out;
  };
  const std::vector<float> tiled = run(pm, false);
  ASSERT_TRUE(same_bits(tiled.data(), run(pm, true).data(), tiled.size())) << "row by row";
  ASSERT_TRUE(same_bits(tiled.data(), run(hm, false).data(), tiled.size())) << "head-major";
  ASSERT_TRUE(same_bits(tiled.data(), run(f32, false).data(), tiled.size())) << "f32 cache of the decoded values";
  std::vector<float> alone(static_cast<size_t>(os));
  for (int i = 0; i < c.n_rows; i += std::max(1, c.n_rows / 4)) {
    AttentionBlock one = a;
    one.q = q.data() + i * qs;
    one.n_rows = 1;
    one.pos0 = c.pos0 + i;
    one.out = alone.data();
    attention_block(one, hm, scalar);
    ASSERT_TRUE(same_bits(alone.data(), &tiled[static_cast<size_t>(i * os)], static_cast<size_t>(c.n_heads * c.v_dim)))
        << "row " << i << " alone";
  }
}

TEST(Kernels, AttentionOverTypedCachesMatchesItsDefinitionBitForBit) {
  const std::vector<Case> cases = {
      // head_dim, v_dim, heads, rows, pos0, window, ring
      {64, 64, 3, 1, 0, 0, 0},        // one row, first position
      {64, 64, 3, 1, 1500, 0, 0},     // one row, long (prefetched) history
      {64, 64, 3, 33, 250, 0, 0},     // a chunk mid-cache
      {128, 128, 8, 9, 40, 0, 0},     // group of 8
      {64, 64, 3, 30, 100, 8, 0},     // window smaller than the block
      {64, 64, 2, 24, 150, 32, 64},   // ring layer, slots wrap in the history
      {192, 128, 4, 25, 77, 0, 0},    // values narrower than keys (MLA)
      {96, 32, 2, 1, 90, 16, 24},     // one row over a ring
  };
  for (KvType t : {KvType::f16, KvType::bf16, KvType::q8_0})
    for (bool scalar : {false, true})
      for (const Case& c : cases) check_typed(t, c, scalar);
  // Head sizes off the 32-value block, for the 16-bit types.
  for (KvType t : {KvType::f16, KvType::bf16})
    for (bool scalar : {false, true}) {
      check_typed(t, {37, 37, 3, 21, 5, 0, 0}, scalar);
      check_typed(t, {24, 16, 2, 9, 30, 0, 0}, scalar);
    }
}

// Every model-loading command takes --kv-type and refuses other names before
// loading; a q8_0 cache of a model whose heads are no multiple of 32 is
// refused naming the width.
TEST(Cli, KvTypeIsCheckedByEveryModelLoadingCommand) {
  const std::string want = "--kv-type: unknown KV cache type 'q4' (the types are f32, f16, bf16 or q8_0)";
  // A model that does not exist: the type is refused before any load (a
  // command that accepted it would fail on the model instead, not hang).
  const std::string m = " -m no-such-model-kvtype --kv-type q4";
  const std::string text = " -f " + std::string(MEGAKERN_SOURCE_DIR) + "/bench/data/gpl-3.0.txt";
  for (const std::string& args : std::vector<std::string>{"run -p hi" + m, "bench --steps 1" + m, "perplexity" + text + m,
                                                          "serve" + m, "step" + m, "chat" + m, "bench-spec" + m}) {
    const CliResult r = run_cli(args + " </dev/null");
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << ": " << r.err;
  }
  const CliResult r = run_cli("run -p hi -m kimi-k3-mini -n 1 --kv-type q8_0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("q8_0 stores blocks of 32 values along a head, but KV layer 0 has heads of 24 (keys)"),
            std::string::npos)
      << r.err;
  const CliResult ok = run_cli("run -p hi -m dense-mini -n 2 --kv-type q8_0");
  EXPECT_EQ(ok.status, 0) << ok.err;
}

}  // namespace
}  // namespace megakern
