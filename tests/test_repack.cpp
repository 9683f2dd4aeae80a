// The weights repacked for the AVX-512 VNNI row-interleaved kernels
// (kernels/cpu/repack.h): their kernels against each mode's scalar oracle,
// bit for bit, on packed rows and through matmul_rows (packed groups plus
// the tail rows of the original layout), and the store that makes one
// packed copy per matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <vector>

#include <unistd.h>

#include "io/mmap_file.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/qmatmul_fast.h"
#include "kernels/cpu/repack.h"
#include "kernels/ref/i16_ref.h"
#include "weights_util.h"

namespace megakern {
namespace {

const DType kFormats[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0};

bool host_has_r16() {
  if (host_runs(KernelIsa::avx512_vnni)) return true;
  std::printf("[kernels] packed r16 kernels (avx512-vnni): not run, the host lacks AVX512-VNNI\n");
  return false;
}

std::vector<float> inputs(int64_t n_x, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x((size_t)(n_x * cols));
  for (float& v : x) v = g(rng);
  if (x.size() > 5) x[5] *= 40.f;  // an outlier block
  return x;
}

struct Packed {
  std::vector<uint8_t> buf;
  MatView view;
};

Packed packed(const MatView& W) {
  Packed p;
  p.buf.assign(r16_packed_bytes(W) + 1, 0xcd);
  r16_pack(W, p.buf.data() + 1);  // misaligned on purpose
  p.view = W;
  p.view.packed = p.buf.data() + 1;
  return p;
}

// Bit for bit, except that any NaN equals any NaN (their sign and payload
// follow which operand carried them, which the contracts do not fix).
::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs oracle " << b[i];
  return ::testing::AssertionSuccess();
}

TEST(Repack, PackedBytesEqualOriginalBytes) {
  for (DType t : kFormats) {
    const Weights w = make_weights(t, 48, 256, 3, 0);
    EXPECT_EQ(r16_packed_bytes(w.view), 48 * row_bytes(t, 256)) << dtype_traits(t).name;
  }
  // Q4_K: its scales and mins as bytes, 64 bytes more per 16 rows and
  // super-block (2.8 %).
  const Weights k = make_weights(DType::Q4_K, 48, 512, 3, 0);
  EXPECT_EQ(r16_packed_bytes(k.view), 3 * 2 * (16 * row_bytes(DType::Q4_K, 256) + 64));
  EXPECT_TRUE(r16_supports(DType::Q4_K, Numerics::Fast));
  EXPECT_FALSE(r16_supports(DType::Q4_K, Numerics::Exact));
  EXPECT_TRUE(r16_supports(DType::Q8_0, Numerics::Exact));
  // Q6_K: its nibbles, high bits, scales and d as many bytes as the original.
  const Weights k6 = make_weights(DType::Q6_K, 48, 512, 3, 0);
  EXPECT_EQ(r16_packed_bytes(k6.view), 48 * row_bytes(DType::Q6_K, 512));
  EXPECT_TRUE(r16_supports(DType::Q6_K, Numerics::Fast));
  EXPECT_FALSE(r16_supports(DType::Q6_K, Numerics::Exact));
  EXPECT_FALSE(r16_supports(DType::Q5_K));
  EXPECT_FALSE(r16_supports(DType::F32));
}

// The packed fast kernel against the fast oracle on a 48-row matrix of
// format t (weights and inputs seeded from cols and n_x, activations in
// blocks of `block`), over each row range; returns the cases run.
int fast_ranges_match_oracle(DType t, int64_t cols, int64_t n_x, int64_t block, uint32_t input_seed,
                             std::initializer_list<std::pair<int64_t, int64_t>> ranges) {
  const int64_t rows = 48;
  const Weights w = make_weights(t, rows, cols, (uint32_t)(cols + n_x), 1);
  const Packed p = packed(w.view);
  const std::vector<float> x = inputs(n_x, cols, input_seed);
  Q8Acts qa;
  quantize_q8_acts(x.data(), n_x, cols, block, qa);
  int cases = 0;
  for (auto [rb, re] : ranges) {
    SCOPED_TRACE(::testing::Message() << dtype_traits(t).name << " cols " << cols << " n_x " << n_x << " rows ["
                                      << rb << ", " << re << ")");
    std::vector<float> y((size_t)(n_x * rows), -1.f), ref = y;
    matmul_rows_fast_r16_evex(p.view, qa, y.data(), rows, rb, re);
    matmul_rows_fast_ref(w.view, qa, ref.data(), rows, rb, re);
    EXPECT_TRUE(same_bits(y, ref));
    ++cases;
  }
  return cases;
}

// The K-quants' packed fast kernels (Q4_K, Q6_K) against the fast oracle:
// one to nine inputs and 128, one to three super-blocks, row ranges inside
// groups.
TEST(Repack, KQuantFastKernelsMatchOracleBitForBit) {
  if (!host_has_r16()) return;
  int cases = 0;
  for (DType t : {DType::Q4_K, DType::Q6_K})
    for (int64_t cols : {256, 512, 768})
    for (int64_t n_x : {1, 2, 3, 4, 5, 8, 9, 128})
      cases += fast_ranges_match_oracle(t, cols, n_x, 256, (uint32_t)(3 * cols + n_x),
                                        {{0, 48}, {3, 29}, {16, 32}, {17, 18}});
  std::printf("[kernels] packed r16 Q4_K / Q6_K fast kernels: %d cases against the scalar oracle\n", cases);
}

// Random bytes as Q4_K / Q6_K weights (every code, scale and min; d and
// dmin inf, NaN or subnormal); inputs with an inf.
TEST(Repack, KQuantRandomBitPatternsMatchOracle) {
  if (!host_has_r16()) return;
  for (DType t : {DType::Q4_K, DType::Q6_K}) {
    SCOPED_TRACE(dtype_traits(t).name);
    std::mt19937 rng(12);
    const int64_t rows = 32, cols = 512;
    const size_t rb = row_bytes(t, cols);
    std::vector<uint8_t> raw(rb * rows);
    for (uint8_t& b : raw) b = (uint8_t)rng();
    const MatView W{t, cols, rows, raw.data(), rb};
    const Packed p = packed(W);
    std::vector<float> x = inputs(3, cols, 6);
    x[300] = INFINITY;
    Q8Acts qa;
    quantize_q8_acts(x.data(), 3, cols, 256, qa);
    std::vector<float> y((size_t)(3 * rows)), ref = y;
    matmul_rows_fast_r16_evex(p.view, qa, y.data(), rows, 0, rows);
    matmul_rows_fast_ref(W, qa, ref.data(), rows, 0, rows);
    EXPECT_TRUE(same_bits(y, ref));
  }
}

// Row ranges that start and end inside groups, odd and even block counts
// (the exact mode's pairs of sub-blocks), one to nine inputs (the kernels'
// input groups of four and two and their remainders).
TEST(Repack, KernelsMatchEachModesOracleBitForBit) {
  if (!host_has_r16()) return;
  int cases = 0;
  for (DType t : kFormats)
    for (int64_t cols : {32, 96, 256, 288})
      for (int64_t n_x : {1, 2, 3, 4, 5, 8, 9}) {
        const int64_t rows = 48;
        const Weights w = make_weights(t, rows, cols, (uint32_t)(cols + n_x), 1);
        const Packed p = packed(w.view);
        const std::vector<float> x = inputs(n_x, cols, (uint32_t)(7 * cols + n_x));
        for (auto [rb, re] : {std::pair<int64_t, int64_t>{0, 48}, {3, 29}, {16, 32}, {17, 18}}) {
          SCOPED_TRACE(::testing::Message() << dtype_traits(t).name << " cols " << cols << " n_x " << n_x << " rows ["
                                            << rb << ", " << re << ")");
          Q8Acts qa;
          quantize_q8_acts(x.data(), n_x, cols, 32, qa);
          std::vector<float> y((size_t)(n_x * rows), -1.f), ref = y;
          matmul_rows_fast_r16_evex(p.view, qa, y.data(), rows, rb, re);
          matmul_rows_fast_ref(w.view, qa, ref.data(), rows, rb, re);
          EXPECT_TRUE(same_bits(y, ref)) << "fast";
          QuantizedActs ia;
          quantize_acts(x.data(), n_x, cols, ia);
          std::fill(y.begin(), y.end(), -1.f);
          std::fill(ref.begin(), ref.end(), -1.f);
          matmul_rows_i16_r16_evex(p.view, ia, y.data(), rows, rb, re);
          matmul_rows_i16_ref(w.view, ia, ref.data(), rows, rb, re);
          EXPECT_TRUE(same_bits(y, ref)) << "exact";
          ++cases;
        }
      }
  std::printf("[kernels] packed r16 kernels (avx512-vnni): %d cases per mode against the scalar oracles\n", cases);
}

// The fast mode's many-input path (r16_many_inputs on): input counts that
// leave every remainder of its passes of eight (4, 2, 1), block counts
// across its chunks of sixteen (odd ones, a last short chunk), row ranges
// inside groups; random bytes as weights (every code, inf / NaN / subnormal
// scales) and an input with an inf. Bit for bit against the scalar oracle.
TEST(Repack, ManyInputFastKernelMatchesOracleBitForBit) {
  if (!host_has_r16()) return;
  int cases = 0;
  for (DType t : kFormats)
    for (int64_t cols : {32, 544, 1184})
      for (int64_t n_x : {r16_many_inputs(), (int64_t)23, (int64_t)40})
        cases += fast_ranges_match_oracle(t, cols, n_x, 32, (uint32_t)(5 * cols + n_x), {{0, 48}, {3, 29}, {17, 18}});
  std::mt19937 rng(12);
  for (DType t : kFormats) {
    const int64_t rows = 32, cols = 640, n_x = 21;
    const size_t rb = row_bytes(t, cols);
    std::vector<uint8_t> raw(rb * rows);
    for (uint8_t& b : raw) b = (uint8_t)rng();
    const MatView W{t, cols, rows, raw.data(), rb};
    const Packed p = packed(W);
    std::vector<float> x = inputs(n_x, cols, 6);
    x[5 * cols + 70] = INFINITY;
    Q8Acts qa;
    quantize_q8_acts(x.data(), n_x, cols, 32, qa);
    std::vector<float> y((size_t)(n_x * rows)), ref = y;
    matmul_rows_fast_r16_evex(p.view, qa, y.data(), rows, 0, rows);
    matmul_rows_fast_ref(W, qa, ref.data(), rows, 0, rows);
    EXPECT_TRUE(same_bits(y, ref)) << dtype_traits(t).name << " random bytes";
    ++cases;
  }
  std::printf("[kernels] many-input packed fast kernel: %d cases against the scalar oracle\n", cases);
}

// Random bytes as weights: every code, and scales that are inf, NaN or
// subnormal; inputs with an inf.
TEST(Repack, RandomBitPatternsMatchOracle) {
  if (!host_has_r16()) return;
  std::mt19937 rng(11);
  for (DType t : kFormats) {
    const int64_t rows = 32, cols = 128;
    const size_t rb = row_bytes(t, cols);
    std::vector<uint8_t> raw(rb * rows);
    for (uint8_t& b : raw) b = (uint8_t)rng();
    const MatView W{t, cols, rows, raw.data(), rb};
    const Packed p = packed(W);
    std::vector<float> x = inputs(3, cols, 5);
    x[40] = INFINITY;
    for (int mode = 0; mode < 2; ++mode) {
      std::vector<float> y((size_t)(3 * rows)), ref = y;
      if (mode == 0) {
        Q8Acts qa;
        quantize_q8_acts(x.data(), 3, cols, 32, qa);
        matmul_rows_fast_r16_evex(p.view, qa, y.data(), rows, 0, rows);
        matmul_rows_fast_ref(W, qa, ref.data(), rows, 0, rows);
      } else {
        QuantizedActs ia;
        quantize_acts(x.data(), 3, cols, ia);
        matmul_rows_i16_r16_evex(p.view, ia, y.data(), rows, 0, rows);
        matmul_rows_i16_ref(W, ia, ref.data(), rows, 0, rows);
      }
      EXPECT_TRUE(same_bits(y, ref)) << dtype_traits(t).name << (mode ? " exact" : " fast");
    }
  }
}

// matmul_rows with a packed copy: the packed groups and the original rows
// past them give what the original layout alone gives, in both modes.
TEST(Repack, MatmulRowsWithPackedCopyMatchesOriginal) {
  if (!host_has_r16()) return;
  // 20 inputs: the fast mode's many-input path, the exact mode's original rows.
  for (DType t : kFormats)
    for (Numerics nm : {Numerics::Exact, Numerics::Fast})
      for (int64_t n_x : {3, 20}) {
        const int64_t rows = 77, cols = 160;  // 4 groups and 13 tail rows
        const Weights w = make_weights(t, rows, cols, 21, 0);
        const Packed p = packed(w.view);
        const std::vector<float> x = inputs(n_x, cols, 8);
        std::vector<float> y((size_t)(n_x * rows)), ref = y;
        matmul_rows(p.view, x.data(), n_x, y.data(), rows, 5, rows, nm);
        matmul_rows(w.view, x.data(), n_x, ref.data(), rows, 5, rows, nm);
        EXPECT_TRUE(same_bits(y, ref)) << dtype_traits(t).name << ' ' << numerics_name(nm) << " n_x " << n_x;
      }
  // Q4_K, Q6_K: packed groups in the fast mode; the exact mode, which has
  // no packed kernel for them, reads the original rows. 40 rows: 8 tail rows.
  for (DType t : {DType::Q4_K, DType::Q6_K})
  for (Numerics nm : {Numerics::Exact, Numerics::Fast})
    for (int64_t rows : {40, 77})
      for (int64_t n_x : {1, 2, 8}) {
        const int64_t cols = 512;
        const Weights w = make_weights(t, rows, cols, 22, 0);
        const Packed p = packed(w.view);
        const std::vector<float> x = inputs(n_x, cols, 9);
        std::vector<float> y((size_t)(n_x * rows)), ref = y;
        matmul_rows(p.view, x.data(), n_x, y.data(), rows, 5, rows, nm);
        matmul_rows(w.view, x.data(), n_x, ref.data(), rows, 5, rows, nm);
        EXPECT_TRUE(same_bits(y, ref)) << dtype_traits(t).name << ' ' << numerics_name(nm) << " rows " << rows
                                       << " n_x " << n_x;
      }
}

TEST(Repack, StoreMakesOneCopyPerMatrix) {
  PackedWeights store;
  const Weights a = make_weights(DType::Q8_0, 40, 64, 1, 0), b = make_weights(DType::Q4_K, 40, 256, 2, 0);
  const MatView pa = store.pack(a.view, Numerics::Exact), pa2 = store.pack(a.view, Numerics::Fast),
                pb = store.pack(b.view, Numerics::Exact);
  EXPECT_EQ(pb.packed, nullptr);  // no packed exact-mode kernel for Q4_K
  if (!repack_enabled()) {
    EXPECT_EQ(pa.packed, nullptr);
    EXPECT_EQ(store.bytes(), 0u);
    return;
  }
  ASSERT_NE(pa.packed, nullptr);
  EXPECT_EQ(pa.packed, pa2.packed);
  EXPECT_EQ(pa.data, a.view.data);
  EXPECT_EQ(store.bytes(), r16_packed_bytes(a.view));
  EXPECT_EQ(0, std::memcmp(pa.packed, packed(a.view).view.packed, r16_packed_bytes(a.view)));
}

}  // namespace
}  // namespace megakern

namespace megakern {
namespace {

// The original pages of repacked weights leave memory only when they belong
// to a mapped file, and read back unchanged afterwards.
TEST(Repack, ReleasesOnlyMappedFilePages) {
  char path[] = "/tmp/megakern_release_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> bytes(1 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = (uint8_t)(i * 131 + 7);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), (ssize_t)bytes.size());
  close(fd);
  {
    MappedFile f(path);
    uint64_t sum = 0;
    for (size_t i = 0; i < f.size(); i += 4096) sum += f.data()[i];
    EXPECT_GT(sum, 0u);
    EXPECT_TRUE(release_mapped_pages(f.data() + 100, f.size() - 200));
    EXPECT_EQ(0, std::memcmp(f.data(), bytes.data(), bytes.size()));
    EXPECT_FALSE(release_mapped_pages(f.data() + f.size() - 10, 20));  // runs past the mapping
  }
  EXPECT_FALSE(release_mapped_pages(bytes.data(), bytes.size()));  // heap
  const std::vector<uint8_t> copy = bytes;
  EXPECT_EQ(copy, bytes);
  unlink(path);
}

// A MappedFile owned by a static object that exists before the first mapping
// of the process (a test's model cache, say) is destroyed after everything
// constructed later; its unregistering at exit must not touch a destroyed
// registry. Run in a fresh process (threadsafe style re-executes the binary),
// where this is the first mapping.
TEST(Repack, MappedFileHeldByAnEarlierStaticUnmapsCleanlyAtExit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  char path[] = "/tmp/megakern_static_map_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::vector<uint8_t> bytes(8192, 5);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), (ssize_t)bytes.size());
  close(fd);
  EXPECT_EXIT(
      {
        static std::unique_ptr<MappedFile> held;  // constructed before any mapping
        held = std::make_unique<MappedFile>(path);
        std::exit(held->data()[0] == 5 ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
  unlink(path);
}

}  // namespace
}  // namespace megakern

#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "runtime/model.h"
#include "test_util.h"

namespace megakern {
namespace {

// A whole model: the engine on repacked weights gives the bits of the same
// engine on the original layout, in both numerics modes, batch 1 and 3
// (Qwen3.8 mini, its matrices converted to each packed format; the formats'
// matrices are what the program's products read, the embedding and the
// reference paths read the original rows).
TEST(Repack, EngineOnRepackedWeightsGivesTheOriginalBits) {
  if (!host_has_r16()) return;
  if (!repack_enabled()) {
    std::printf("[kernels] engine on repacked weights: not run, MEGAKERN_ISA or MEGAKERN_REPACK turns repacking off\n");
    return;
  }
  ThreadPool pool(2);
  for (DType t : kFormats)
    for (Numerics nm : {Numerics::Exact, Numerics::Fast}) {
      SCOPED_TRACE(::testing::Message() << dtype_traits(t).name << ' ' << numerics_name(nm));
      ModelOptions o;
      o.weights = t;
      o.numerics = nm;
      auto m = load_model("qwen3.8-mini", o);
      std::vector<float> logits[2];
      for (int packed = 0; packed < 2; ++packed) {
        m->set_repack_weights(packed == 1);
        m->set_repack_exact(true);  // the exact mode's packed kernels too (not packed by default)
        Engine e(*m, pool, 4);
        SequenceState seq = m->new_sequence(64);
        const std::vector<int32_t> toks = {1, 17, 42, 99, 5, 64, 3, 250, 8, 11};
        logits[packed].resize((size_t)toks.size() * m->n_vocab());
        e.teacher_forced_logits(seq, toks.data(), (int)toks.size(), 0, (int)toks.size(), logits[packed].data(), false);
      }
      EXPECT_GT(m->packed_weight_bytes(), 0u);
      EXPECT_TRUE(same_bits(logits[1], logits[0]));
    }
}

// The fast mode's packed K-quant kernels through the engine: dense-mini with
// every matrix converted to Q4_K and to Q6_K, and the fetched Gemma 3 file
// (Q4_K_M: Q4_K beside Q5_0 / Q6_K / Q8_0), batch 1 and 3 rows per step;
// the repacked weights give the original layout's bits.
TEST(Repack, EngineOnRepackedKQuantsGivesTheOriginalBits) {
  if (!host_has_r16()) return;
  if (!repack_enabled()) {
    std::printf("[kernels] engine on repacked K-quants: not run, MEGAKERN_ISA or MEGAKERN_REPACK turns repacking off\n");
    return;
  }
  ThreadPool pool(2);
  std::vector<std::pair<std::string, DType>> names = {{"dense-mini", DType::Q4_K}, {"dense-mini", DType::Q6_K}};
  if (!test_model_path("gemma3-270m").empty()) names.push_back({test_model_path("gemma3-270m"), DType::F32});
  else std::printf("[kernels] engine on repacked K-quants: gemma3-270m not fetched, dense-mini only\n");
  for (const auto& [name, weights] : names)
    for (int rows : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << name << ' ' << dtype_traits(weights).name << " rows " << rows);
      ModelOptions o;
      if (name == "dense-mini") o.weights = weights;
      o.numerics = Numerics::Fast;
      auto m = load_model(name, o);
      std::vector<float> logits[2];
      for (int packed = 0; packed < 2; ++packed) {
        m->set_repack_weights(packed == 1);
        Engine e(*m, pool, rows);
        SequenceState seq = m->new_sequence(32);
        const std::vector<int32_t> toks = {1, 17, 42, 99, 5, 64};
        logits[packed].resize((size_t)toks.size() * m->n_vocab());
        e.teacher_forced_logits(seq, toks.data(), (int)toks.size(), 0, (int)toks.size(), logits[packed].data(), false);
      }
      EXPECT_GT(m->packed_weight_bytes(), 0u);
      EXPECT_TRUE(same_bits(logits[1], logits[0]));
    }
}

}  // namespace
}  // namespace megakern
