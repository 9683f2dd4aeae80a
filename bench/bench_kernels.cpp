// Micro-benchmarks of the matrix kernels at the memory roofline.
//
//   BM_ReadBandwidth/threads:T   streaming sum over a 512 MiB buffer with the
//                                same ThreadPool (T threads): the probe.
//   BM_Matmul/<format>/rows:R/threads:T
//                                matmul(pool, W, X, R, Y) with W a >= 64 MiB
//                                matrix of 4096 columns in <format>.
//   BM_MatmulFast/<format>/rows:R/threads:T
//                                the fast numerics mode (8-bit activations,
//                                core/numerics.h), for the formats that have
//                                it, on the first 256 rows of that matrix (a
//                                few hundred KiB, cache-resident: the kernel's
//                                arithmetic throughput, many short calls); the
//                                activation quantisation is part of each call.
//                                GMAC/s = R x rows x 4096 multiply-adds per
//                                call / time (also on BM_Matmul).
//   BM_FmaPeak/threads:T         the compute roofline of f32 work: each
//                                thread runs twelve independent chains of
//                                256-bit FMAs (enough to cover their latency
//                                on two FMA ports); GMAC/s = 8 multiply-adds
//                                per FMA, all threads together. Against
//                                BM_Matmul's GMAC/s it says how far a kernel
//                                is from the FMA ports' limit.
//   BM_LoopPeak/<loop>/threads:T the compute roofline of each integer
//                                kernel family: its innermost pass's
//                                instruction mix per multiply-add, operands
//                                in L1 (fast_u4_avx2: 4-bit codes, vpmaddubsw;
//                                fast_i16_avx2: signed 8-bit weights as int16,
//                                vpmaddwd; fast_u4_vnni: vpdpbusd, two tiles;
//                                exact_i16 / exact_i16_mins: the exact mode's
//                                decoded panel, int16 products and an f32
//                                step per 32 values, with mins as Q4_K / Q4_1).
//                                Against BM_Matmul(Fast)'s GMAC/s at 64 rows
//                                it says how far a kernel is from what its
//                                instructions allow.
//   BM_Attention/<kv type>/ctx:N/threads:T/kv:K
//                                one decode row attending over N cached
//                                positions, 32 query / 8 KV heads of 128, K and
//                                V stored as f32, f16, bf16 or q8_0 and read
//                                once (bytes = the cache's); tiles (one per
//                                head) split across the pool.
//   BM_GluAct/<silu|gelu_tanh|situ>/<scalar|dispatch>
//                                the gated activation over 4096 values in L1,
//                                C library formulas vs the run-time choice
//                                (AVX2 here); items/s = values per second.
//   BM_DeltaRule/block:B/threads:T
//                                a Gated DeltaNet layer of the Qwen3.8 size (16
//                                key / 48 value heads of 128, f32 state 3 MiB)
//                                advanced by a block of B tokens of one
//                                sequence (B = 1: the recurrent step; B > 1:
//                                the chunked form); bytes = the state read and
//                                written once per call. Calls cycle through
//                                16 such states (48 MiB, past L3) as a model's
//                                layers would. items/s (tokens/s) is the
//                                figure to compare across B.
// Counters: bytes (weight bytes read per call; inputs and outputs are
// negligible and not counted), GB/s (bytes / wall time, 1e9), pct_probe (GB/s
// as a percentage of the probe for the same thread count, probed once at
// start-up); BM_Matmul also GMAC/s (rows x cols x inputs multiply-adds per
// second, 1e9), the measure once many inputs make it compute-bound.
// Run through scripts/bench_kernels.sh, which prints a table.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "exec/op_kernels.h"
#include "exec/recurrent_kernels.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/qmatmul_fast.h"
#include "kernels/cpu/repack.h"

namespace {

using namespace megakern;

constexpr int64_t kCols = 4096;
constexpr size_t kMinMatrixBytes = size_t{64} << 20;
constexpr int64_t kFastRows = 256;  // BM_MatmulFast's rows
constexpr size_t kProbeBytes = size_t{512} << 20;

ThreadPool& pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

// --- read-bandwidth probe ----------------------------------------------------

std::vector<uint64_t>& probe_buffer() {
  static std::vector<uint64_t> buf = [] {
    std::vector<uint64_t> b(kProbeBytes / 8);
    for (size_t i = 0; i < b.size(); ++i) b[i] = i * 0x9e3779b97f4a7c15ull;
    return b;
  }();
  return buf;
}

uint64_t stream_sum(ThreadPool& p) {
  const auto& buf = probe_buffer();
  const int workers = p.size();
  std::vector<uint64_t> partial((size_t)workers * 8, 0);  // one cache line each
  const int64_t n = (int64_t)buf.size();
  p.run([&](int w) {
    // Contiguous, equal ranges, as matmul's row split.
    const int64_t b = n * w / workers, e = n * (w + 1) / workers;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = b;
    for (; i + 4 <= e; i += 4) {
      s0 += buf[(size_t)i];
      s1 += buf[(size_t)i + 1];
      s2 += buf[(size_t)i + 2];
      s3 += buf[(size_t)i + 3];
    }
    for (; i < e; ++i) s0 += buf[(size_t)i];
    partial[(size_t)w * 8] = s0 + s1 + s2 + s3;
  });
  uint64_t s = 0;
  for (uint64_t v : partial) s += v;
  return s;
}

// Best of a few passes, in GB/s; used for pct_probe.
double probe_gbps(int threads) {
  static std::map<int, double> cache;
  auto it = cache.find(threads);
  if (it != cache.end()) return it->second;
  ThreadPool& p = pool(threads);
  stream_sum(p);  // fault the pages in
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(stream_sum(p));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, (double)kProbeBytes / s / 1e9);
  }
  return cache[threads] = best;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const int threads = (int)state.range(0);
  ThreadPool& p = pool(threads);
  stream_sum(p);
  for (auto _ : state) benchmark::DoNotOptimize(stream_sum(p));
  state.counters["bytes"] = (double)kProbeBytes;
  state.counters["GB/s"] =
      benchmark::Counter((double)kProbeBytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// --- compute roofline ---------------------------------------------------------

#if defined(__x86_64__)
#include <immintrin.h>
// n rounds of twelve independent FMA chains; returns a value that depends on
// all of them.
__attribute__((target("avx2,fma"))) float fma_chains(int64_t n) {
  __m256 a0 = _mm256_set1_ps(1.f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
         a9 = a0, a10 = a0, a11 = a0;
  const __m256 m = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < n; ++i) {
    a0 = _mm256_fmadd_ps(a0, m, c), a1 = _mm256_fmadd_ps(a1, m, c), a2 = _mm256_fmadd_ps(a2, m, c);
    a3 = _mm256_fmadd_ps(a3, m, c), a4 = _mm256_fmadd_ps(a4, m, c), a5 = _mm256_fmadd_ps(a5, m, c);
    a6 = _mm256_fmadd_ps(a6, m, c), a7 = _mm256_fmadd_ps(a7, m, c), a8 = _mm256_fmadd_ps(a8, m, c);
    a9 = _mm256_fmadd_ps(a9, m, c), a10 = _mm256_fmadd_ps(a10, m, c), a11 = _mm256_fmadd_ps(a11, m, c);
    // Keeps the twelve chains in registers and in this order.
    __asm__("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9),
            "+x"(a10), "+x"(a11));
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  return _mm256_cvtss_f32(_mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11))));
}
#endif

void BM_FmaPeak(benchmark::State& state) {
#if defined(__x86_64__)
  if (!use_avx2()) {
    state.SkipWithError("no AVX2/FMA");
    return;
  }
  const int threads = (int)state.range(0);
  ThreadPool& p = pool(threads);
  constexpr int64_t kRounds = 2'000'000;
  std::vector<float> sink((size_t)threads);
  for (auto _ : state) p.run([&](int w) { sink[(size_t)w] = fma_chains(kRounds); });
  benchmark::DoNotOptimize(sink.data());
  state.counters["GMAC/s"] = benchmark::Counter(12.0 * 8.0 * (double)kRounds * threads / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);
#else
  state.SkipWithError("x86-64 only");
#endif
}

#if defined(__x86_64__)
// The integer kernels' inner loops without their memory: each loop below has
// the operation mix per multiply-add of one kernel's innermost pass (the
// operand vectors in L1, broadcasts of input bytes from memory as the
// kernels load them, every chain independent), so its GMAC/s is what that
// instruction sequence can reach on this core: the roofline a kernel of
// that mix is measured against. MACs counted as weight x input products.
namespace loops {

constexpr int kNT = 4;  // inputs per pass, as the fast register-blocked kernel

// Operands: a 32-element block of eight rows (vectors of four bytes per row
// lane, or two int16) and the inputs' bytes, 4 KiB apart at most.
struct alignas(64) Data {
  uint8_t w[2][16][32];    // two tiles of eight rows: 16 vectors each
  uint8_t x[kNT][64];      // input bytes / int16 per input
  float sx[kNT][8];        // per-input scale
  float s0[2][8];          // per-row scales of each tile
};

// kNT chains of one block's steps: step j multiplies weight vector j by the
// broadcast of input i's four bytes 4j .. 4j + 3 and adds the product to
// chain i, each chain in program order as the kernels keep them. kI16:
// signed int16 weights (16 steps, vpmaddwd, int32 sums); otherwise 4-bit
// codes (8 steps, vpmaddubsw, int16 sums).
template <bool kI16>
__attribute__((target("avx2,fma"), always_inline)) inline void int_run(const Data& d, __m256i (&s)[kNT]) {
  constexpr int kSteps = kI16 ? 16 : 8;
#pragma GCC unroll 16
  for (int j = 0; j < kSteps; ++j) {
    const uint8_t* wp = kI16 ? d.w[j / 8][(j % 8) * 2] : d.w[0][j];
    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp));
#pragma GCC unroll 4
    for (int i = 0; i < kNT; ++i) {
      int32_t v;
      std::memcpy(&v, d.x[i] + 4 * j, 4);
      const __m256i x = _mm256_set1_epi32(v);
      const __m256i p = kI16 ? _mm256_madd_epi16(w, x) : _mm256_maddubs_epi16(w, x);
      s[i] = j == 0 ? p : kI16 ? _mm256_add_epi32(s[i], p) : _mm256_add_epi16(s[i], p);
      __asm__("" : "+x"(s[i]));
    }
  }
}

// Fast mode, AVX2, unsigned 4-bit codes (Q4_0 ...): per block and input, 8
// vpbroadcastd + 8 vpmaddubsw + 7 vpaddw, 1 vpmaddwd, then vpsubd (offset),
// vcvtdq2ps, vmulps, vfmadd. 32 x 8 x kNT MACs per block.
__attribute__((target("avx2,fma"))) float fast_u4_avx2(const Data& d, int64_t blocks) {
  __m256 acc[kNT];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1), off = _mm256_set1_epi32(3);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i s[kNT];
    int_run<false>(d, s);
    const __m256 sc = _mm256_load_ps(d.s0[0]);
#pragma GCC unroll 4
    for (int i = 0; i < kNT; ++i) {
      const __m256i v = _mm256_sub_epi32(_mm256_madd_epi16(s[i], ones), off);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(sc, _mm256_broadcast_ss(d.sx[i])), acc[i]);
    }
    __asm__ volatile("" : "+x"(acc[0]), "+x"(acc[1]), "+x"(acc[2]), "+x"(acc[3]) : : "memory");
  }
  return _mm256_cvtss_f32(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

// Fast mode, AVX2, signed 8-bit weights as int16 (Q8_0): per block and
// input, 16 vpbroadcastd + 16 vpmaddwd + 15 vpaddd, then vcvtdq2ps, vmulps,
// vfmadd.
__attribute__((target("avx2,fma"))) float fast_i16_avx2(const Data& d, int64_t blocks) {
  __m256 acc[kNT];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i s[kNT];
    int_run<true>(d, s);
    const __m256 sc = _mm256_load_ps(d.s0[0]);
#pragma GCC unroll 4
    for (int i = 0; i < kNT; ++i)
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(sc, _mm256_broadcast_ss(d.sx[i])), acc[i]);
    __asm__ volatile("" : "+x"(acc[0]), "+x"(acc[1]), "+x"(acc[2]), "+x"(acc[3]) : : "memory");
  }
  return _mm256_cvtss_f32(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

// Fast mode, AVX-VNNI, 32-element formats with two tiles per pass: per block
// and input, 8 vpbroadcastd and 16 vpdpbusd (8 per tile), then per tile
// vpsubd, vcvtdq2ps, vmulps, vfmadd. 32 x 16 x kNT MACs per block.
__attribute__((target("avx2,fma,avxvnni"))) float fast_u4_vnni(const Data& d, int64_t blocks) {
  __m256 acc[2][kNT];
  for (auto& t : acc)
    for (auto& a : t) a = _mm256_setzero_ps();
  const __m256i off = _mm256_set1_epi32(3);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i s[2][kNT];
    for (auto& t : s)
      for (auto& v : t) v = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(d.w[0][g]));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(d.w[1][g]));
#pragma GCC unroll 4
      for (int i = 0; i < kNT; ++i) {
        int32_t v;
        std::memcpy(&v, d.x[i] + 4 * g, 4);
        const __m256i x = _mm256_set1_epi32(v);
        s[0][i] = _mm256_dpbusd_avx_epi32(s[0][i], w0, x);
        s[1][i] = _mm256_dpbusd_avx_epi32(s[1][i], w1, x);
      }
    }
#pragma GCC unroll 2
    for (int t = 0; t < 2; ++t) {
      const __m256 sc = _mm256_load_ps(d.s0[t]);
#pragma GCC unroll 4
      for (int i = 0; i < kNT; ++i)
        acc[t][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s[t][i], off)),
                                    _mm256_mul_ps(sc, _mm256_broadcast_ss(d.sx[i])), acc[t][i]);
    }
    __asm__ volatile("" : "+x"(acc[0][0]), "+x"(acc[0][1]), "+x"(acc[0][2]), "+x"(acc[0][3]), "+x"(acc[1][0]),
                     "+x"(acc[1][1]), "+x"(acc[1][2]), "+x"(acc[1][3]) : : "memory");
  }
  __m256 r = _mm256_setzero_ps();
  for (auto& t : acc)
    for (auto& a : t) r = _mm256_add_ps(r, a);
  return _mm256_cvtss_f32(r);
}

// Exact mode, the decoded panel: two 32-element sub-blocks of one row,
// decoded to int16 (four vectors), against eight inputs. Per input and
// sub-block: two int16 loads, 2 vpmaddwd, a vpaddd, vcvtdq2ps and a vfmadd by
// the broadcast scale product (with kMins, one more vfmadd of the row's min
// by the input's lane sums, as Q4_K / Q4_1), the pair summed from zero and
// then added (vaddps). 2 x 32 x 8 MACs per pass.
template <bool kMins>
__attribute__((target("avx2,fma"))) float exact_i16(const Data& d, int64_t pairs) {
  constexpr int kIn = 8;
  __m256 acc[kIn];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const auto* wv = reinterpret_cast<const __m256i*>(d.w[0]);
  const __m256i c0 = _mm256_load_si256(wv), c1 = _mm256_load_si256(wv + 1), c2 = _mm256_load_si256(wv + 2),
                c3 = _mm256_load_si256(wv + 3);
  const __m256 mn = _mm256_set1_ps(0.125f);
  const auto* xq = reinterpret_cast<const __m256i*>(d.w[1]);  // 16 vectors: the inputs' int16 values
  const float* fac = &d.sx[0][0];                              // 32 scale products
  for (int64_t k = 0; k < pairs; ++k) {
#pragma GCC unroll 8
    for (int i = 0; i < kIn; ++i) {
      const __m256i* x = xq + 2 * (i % 4);
      __m256 t = _mm256_fmadd_ps(
          _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(c0, _mm256_load_si256(x)),
                                              _mm256_madd_epi16(c1, _mm256_load_si256(x + 1)))),
          _mm256_broadcast_ss(fac + i), _mm256_setzero_ps());
      if constexpr (kMins) t = _mm256_fmadd_ps(mn, _mm256_load_ps(d.s0[0]), t);
      t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(c2, _mm256_load_si256(x + 8)),
                                                              _mm256_madd_epi16(c3, _mm256_load_si256(x + 9)))),
                          _mm256_broadcast_ss(fac + 8 + i), t);
      if constexpr (kMins) t = _mm256_fmadd_ps(mn, _mm256_load_ps(d.s0[1]), t);
      acc[i] = _mm256_add_ps(acc[i], t);
    }
    __asm__ volatile("" : "+x"(acc[0]), "+x"(acc[1]), "+x"(acc[2]), "+x"(acc[3]), "+x"(acc[4]), "+x"(acc[5]),
                     "+x"(acc[6]), "+x"(acc[7]) : : "memory");
  }
  __m256 r = _mm256_setzero_ps();
  for (auto& a : acc) r = _mm256_add_ps(r, a);
  return _mm256_cvtss_f32(r);
}

}  // namespace loops

// BM_LoopPeak/<loop>/threads:T: one of the loops above on every thread of
// the pool, GMAC/s of all threads together.
void BM_LoopPeak(benchmark::State& state, int loop) {
  const bool vnni = loop == 2;
  if (!use_avx2() || (vnni && !cpu_features().avxvnni)) {
    state.SkipWithError(vnni ? "no AVX-VNNI" : "no AVX2/FMA");
    return;
  }
  const int threads = (int)state.range(0);
  ThreadPool& p = pool(threads);
  constexpr int64_t kReps = 1'000'000;
  static loops::Data d = [] {
    loops::Data x{};
    for (size_t i = 0; i < sizeof(x.w); ++i) reinterpret_cast<uint8_t*>(x.w)[i] = (uint8_t)((i * 7) & 15);
    for (size_t i = 0; i < sizeof(x.x); ++i) reinterpret_cast<uint8_t*>(x.x)[i] = (uint8_t)((i * 13) & 63);
    for (auto& r : x.sx) std::fill(std::begin(r), std::end(r), 0.5f);
    for (auto& r : x.s0) std::fill(std::begin(r), std::end(r), 0.25f);
    return x;
  }();
  // MACs per repetition of each loop.
  const double macs[] = {32.0 * 8 * loops::kNT, 32.0 * 8 * loops::kNT, 32.0 * 16 * loops::kNT, 2 * 32.0 * 8, 2 * 32.0 * 8};
  std::vector<float> sink((size_t)threads);
  for (auto _ : state)
    p.run([&](int w) {
      float r = 0;
      switch (loop) {
        case 0: r = loops::fast_u4_avx2(d, kReps); break;
        case 1: r = loops::fast_i16_avx2(d, kReps); break;
        case 2: r = loops::fast_u4_vnni(d, kReps); break;
        case 3: r = loops::exact_i16<false>(d, kReps); break;
        default: r = loops::exact_i16<true>(d, kReps); break;
      }
      sink[(size_t)w] = r;
    });
  benchmark::DoNotOptimize(sink.data());
  state.counters["GMAC/s"] = benchmark::Counter(macs[loop] * (double)kReps * threads / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
#endif

// --- matrix products --------------------------------------------------------

struct Matrix {
  DType type;
  std::vector<uint8_t> data;
  MatView view;
};

// One matrix alive at a time (they are 64+ MiB each). Rows are copies of 64
// distinct quantised rows: the content does not matter for speed, and the
// reference quantisers (Q4_K's search in particular) are slow.
const Matrix& matrix(DType t) {
  static std::unique_ptr<Matrix> m;
  if (m && m->type == t) return *m;
  m.reset();
  m = std::make_unique<Matrix>();
  m->type = t;
  const size_t rb = row_bytes(t, kCols);
  int64_t rows = (int64_t)((kMinMatrixBytes + rb - 1) / rb);
  rows = (rows + 63) / 64 * 64;
  m->data.resize(rb * (size_t)rows);
  std::mt19937 rng(42);
  std::normal_distribution<float> g(0.0f, 0.05f);
  std::vector<float> f(kCols);
  for (int64_t j = 0; j < 64; ++j) {
    for (float& v : f) v = g(rng);
    dtype_traits(t).quantize(f.data(), m->data.data() + rb * (size_t)j, kCols);
  }
  for (int64_t j = 64; j < rows; ++j) std::memcpy(m->data.data() + rb * (size_t)j, m->data.data() + rb * (size_t)(j % 64), rb);
  m->view = MatView{t, kCols, rows, m->data.data(), rb};
  return *m;
}

// The matrix of matrix(t) with its packed copy (kernels/cpu/repack.h).
const MatView& packed_matrix(DType t) {
  static PackedWeights store;
  static MatView v;
  if (v.type != t || v.packed == nullptr || v.data != matrix(t).view.data) v = store.pack(matrix(t).view, Numerics::Fast);
  return v;
}

// in_cache: the first kFastRows rows only (what the kernels compute, not
// what memory delivers).
void BM_Matmul(benchmark::State& state, DType t, Numerics numerics, bool packed, bool in_cache) {
  const int64_t n_x = state.range(0);
  const int threads = (int)state.range(1);
  const double probe = probe_gbps(threads);
  const Matrix& m = matrix(t);
  MatView W = packed ? packed_matrix(t) : m.view;
  if (in_cache) W.rows = std::min<int64_t>(W.rows, kFastRows);
  ThreadPool& p = pool(threads);
  std::vector<float> X((size_t)(n_x * kCols)), Y((size_t)(n_x * W.rows));
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (float& v : X) v = g(rng);
  matmul(p, W, X.data(), n_x, Y.data(), numerics);  // warm-up
  for (auto _ : state) {
    matmul(p, W, X.data(), n_x, Y.data(), numerics);
    benchmark::DoNotOptimize(Y.data());
    benchmark::ClobberMemory();
  }
  const double bytes = (double)W.row_bytes * (double)W.rows;
  state.counters["bytes"] = bytes;
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  // pct_probe = 100 * (bytes / time) / probe: a rate counter scaled by 100 / probe.
  state.counters["pct_probe"] =
      benchmark::Counter(bytes / 1e9 * 100.0 / probe, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["probe_GB/s"] = probe;
  const double macs = (double)n_x * (double)W.rows * (double)W.cols;
  state.counters["GMAC/s"] = benchmark::Counter(macs / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// --- attention and the delta rule through the executors' tile kernels -------

// Runs every tile of op over ctx, the tiles split across the pool as the
// op-by-op executor splits them.
void run_tiles(ThreadPool& p, const Op& op, const StepContext& ctx, int n_tiles) {
  p.run([&](int w) {
    const int W = p.size();
    for (int t = n_tiles * w / W; t < n_tiles * (w + 1) / W; ++t) run_op_tile(op, ctx, t, n_tiles);
  });
}

void counters(benchmark::State& state, double bytes, int threads, double per_call_items) {
  const double probe = probe_gbps(threads);
  state.counters["bytes"] = bytes;
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_probe"] =
      benchmark::Counter(bytes / 1e9 * 100.0 / probe, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["items/s"] = benchmark::Counter(per_call_items, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["probe_GB/s"] = probe;
}

void BM_Attention(benchmark::State& state) {
  const int n_ctx = (int)state.range(0), threads = (int)state.range(1);
  const KvType kv_type = static_cast<KvType>(state.range(2));  // core/kv_type.h
  const int H = 32, Hkv = 8, D = 128;
  DecodeProgram prog;
  prog.kv_dim = Hkv * D;
  const int q = prog.add_slot("q", 0, H * D), marker = prog.add_slot("kv", 0, 0), out = prog.add_slot("att", 0, H * D);
  Op& op = prog.add_op(OpKind::Attention, 0, "attention");
  op.in = q;
  op.in2 = marker;
  op.out = out;
  op.as<ops::Attention>().n_head = H;
  op.as<ops::Attention>().n_head_kv = Hkv;
  op.as<ops::Attention>().head_dim = D;
  op.as<ops::Attention>().scale = 1.f / std::sqrt((float)D);
  KVCache cache;
  cache.n_ctx = n_ctx;
  cache.n_layer = 1;
  cache.kv_dim = prog.kv_dim;
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.f, 1.f);
  cache.type = kv_type;
  cache.allocate((size_t)n_ctx * prog.kv_dim, (size_t)n_ctx * prog.kv_dim);
  {
    std::vector<float> kr(prog.kv_dim), vr(prog.kv_dim);
    for (int p = 0; p < n_ctx; ++p) {
      for (auto& x : kr) x = g(rng);
      for (auto& x : vr) x = g(rng);
      cache.store(0, p, kr.data(), vr.data());
    }
  }
  std::vector<float> qv(H * D), ov(H * D);
  for (auto& x : qv) x = g(rng);
  RowInput row{0, n_ctx - 1, &cache, nullptr};
  StepContext ctx;
  ctx.program = &prog;
  ctx.slot = {qv.data(), nullptr, ov.data()};
  ctx.rows = &row;
  ctx.n_rows = 1;
  ThreadPool& p = pool(threads);
  const int tiles = op_tile_count(prog.ops[0], 1, threads);
  run_tiles(p, prog.ops[0], ctx, tiles);
  for (auto _ : state) {
    run_tiles(p, prog.ops[0], ctx, tiles);
    benchmark::DoNotOptimize(ov.data());
  }
  counters(state, static_cast<double>(cache.bytes()), threads, 1);
}

void BM_DeltaRule(benchmark::State& state) {
  const int block = (int)state.range(0), threads = (int)state.range(1);
  const int Hk = 16, Hv = 48, Dk = 128, Dv = 128;
  DecodeProgram prog;
  const int in = prog.add_slot("qkv", 0, 2 * Hk * Dk + Hv * Dv), ba = prog.add_slot("ba", 0, 2 * Hv),
            out = prog.add_slot("o", 0, Hv * Dv);
  std::vector<float> a_log(Hv), dt_bias(Hv);
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int h = 0; h < Hv; ++h) {
    a_log[h] = std::log(1.f + (float)h / 4.f);
    dt_bias[h] = 1.f;
  }
  Op& op = prog.add_op(OpKind::DeltaRule, 0, "delta_rule");
  op.in = in;
  op.in2 = ba;
  op.out = out;
  op.as<ops::DeltaRule>().n_head = Hv;
  op.as<ops::DeltaRule>().n_head_kv = Hk;
  op.as<ops::DeltaRule>().head_dim = Dv;
  op.as<ops::DeltaRule>().a_log = a_log;
  op.as<ops::DeltaRule>().dt_bias = dt_bias;
  op.as<ops::DeltaRule>().scale = 1.f / std::sqrt((float)Dk);
  op.as<ops::DeltaRule>().cache_index = 0;
  constexpr int kStates = 16;
  RecurrentState st(kStates, 2 * Hk * Dk + Hv * Dv, 3, Hv, Dv, Dk);
  KVCache cache;
  std::vector<float> xin((size_t)block * (2 * Hk * Dk + Hv * Dv)), xba((size_t)block * 2 * Hv),
      xo((size_t)block * Hv * Dv);
  for (auto& x : xin) x = g(rng);
  for (auto& x : xba) x = g(rng);
  std::vector<RowInput> rows;
  for (int r = 0; r < block; ++r) rows.push_back({0, r, &cache, &st});
  StepContext ctx;
  ctx.program = &prog;
  ctx.slot = {xin.data(), xba.data(), xo.data()};
  ctx.rows = rows.data();
  ctx.n_rows = block;
  ThreadPool& p = pool(threads);
  const int tiles = op_tile_count(prog.ops[0], block, threads);
  run_tiles(p, prog.ops[0], ctx, tiles);
  int layer = 0;
  for (auto _ : state) {
    prog.ops[0].as<ops::DeltaRule>().cache_index = layer;
    layer = (layer + 1) % kStates;
    run_tiles(p, prog.ops[0], ctx, tiles);
    benchmark::DoNotOptimize(xo.data());
  }
  counters(state, 2.0 * (double)st.S.size() / kStates * sizeof(float), threads, block);
}

// GLU activations over 4096 values (in L1), one thread: the C library
// formulas against the AVX2 version; items/s = values per second.
void BM_GluAct(benchmark::State& state, GluKind k, bool vector) {
  const int64_t n = 4096;
  std::vector<float> g(n), u(n), o(n);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-6.f, 6.f);
  for (int64_t i = 0; i < n; ++i) {
    g[static_cast<size_t>(i)] = d(rng);
    u[static_cast<size_t>(i)] = d(rng);
  }
  for (auto _ : state) {
    if (vector)
      glu_act(k, g.data(), u.data(), 1.f, 1.f, o.data(), n);
    else
      glu_act_scalar(k, g.data(), u.data(), 1.f, 1.f, o.data(), n);
    benchmark::DoNotOptimize(o.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// A benchmark whose only argument is the thread count, run with 1 and 2.
void register_per_threads(const char* name, void (*fn)(benchmark::State&), double min_time) {
  for (int threads : {1, 2})
    benchmark::RegisterBenchmark(name, fn)
        ->Arg(threads)
        ->ArgName("threads")
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(min_time);
}

void register_all() {
  register_per_threads("BM_ReadBandwidth", BM_ReadBandwidth, 0.5);
  register_per_threads("BM_FmaPeak", BM_FmaPeak, 0.3);
#if defined(__x86_64__)
  {
    const char* names[] = {"fast_u4_avx2", "fast_i16_avx2", "fast_u4_vnni", "exact_i16", "exact_i16_mins"};
    for (int loop = 0; loop < 5; ++loop)
      for (int threads : {1, 2})
        benchmark::RegisterBenchmark((std::string("BM_LoopPeak/") + names[loop]).c_str(),
                                     [loop](benchmark::State& s) { BM_LoopPeak(s, loop); })
            ->Arg(threads)
            ->ArgName("threads")
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.2);
  }
#endif
  size_t n = 0;
  const DType* all = all_dtypes(&n);
  for (size_t i = 0; i < n; ++i) {
    const DType t = all[i];
    const std::string name = std::string("BM_Matmul/") + dtype_traits(t).name;
    auto* b = benchmark::RegisterBenchmark(name.c_str(), [t](benchmark::State& s) { BM_Matmul(s, t, Numerics::Exact, false, false); });
    b->ArgNames({"rows", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.3);
    for (int64_t rows : {1, 2, 4, 8, 16, 64})
      for (int threads : {1, 2}) b->Args({rows, threads});
  }
  for (size_t i = 0; i < n; ++i) {
    const DType t = all[i];
    if (!uses_fast_acts(t)) continue;
    const std::string name = std::string("BM_MatmulFast/") + dtype_traits(t).name;
    auto* b = benchmark::RegisterBenchmark(name.c_str(), [t](benchmark::State& s) { BM_Matmul(s, t, Numerics::Fast, false, true); });
    b->ArgNames({"rows", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.3);
    for (int64_t rows : {1, 4, 16, 64})
      for (int threads : {1, 2}) b->Args({rows, threads});
  }
  // The packed layout's kernels (hosts with AVX512-VNNI): both modes with the
  // matrices in memory, and the fast mode's in cache (compute), each beside
  // the same matrix in its original layout.
  if (repack_enabled())
    for (size_t i = 0; i < n; ++i) {
      const DType t = all[i];
      if (!r16_supports(t)) continue;
      for (int v = 0; v < 8; ++v) {
        // exact in memory, fast in memory, fast in cache, exact in cache
        const bool pk = v % 2 == 1;
        const Numerics nm = v < 2 || v >= 6 ? Numerics::Exact : Numerics::Fast;
        const bool dram = v < 4;
        if (!r16_supports(t, nm)) continue;
        const char* kind[] = {"BM_MatmulR16/", "BM_MatmulFastDramR16/", "BM_MatmulFastR16/", "BM_MatmulCacheR16/"};
        const std::string name = std::string(kind[v / 2]) +
                                 dtype_traits(t).name + (pk ? "/packed" : "/original");
        auto* b = benchmark::RegisterBenchmark(name.c_str(),
                                               [=](benchmark::State& s) { BM_Matmul(s, t, nm, pk, !dram); });
        b->ArgNames({"rows", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.3);
        for (int64_t rows : {1, 2, 4, 8, 128})
          for (int threads : {1, 2}) b->Args({rows, threads});
      }
    }
  for (int threads : {1, 2}) {
    for (int64_t ctx : {512, 4096, 32768})
      for (KvType t : {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0})
        benchmark::RegisterBenchmark((std::string("BM_Attention/") + kv_type_name(t)).c_str(), BM_Attention)
            ->Args({ctx, threads, static_cast<int64_t>(t)})
            ->ArgNames({"ctx", "threads", "kv"})
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.2);
    for (int64_t block : {1, 8, 64})
      benchmark::RegisterBenchmark("BM_DeltaRule", BM_DeltaRule)
          ->Args({block, threads})
          ->ArgNames({"block", "threads"})
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.2);
  }
  for (auto [kind, name] : {std::pair{GluKind::SiLU, "silu"}, std::pair{GluKind::GeluTanh, "gelu_tanh"},
                            std::pair{GluKind::SiTU, "situ"}})
    for (bool vector : {false, true})
      benchmark::RegisterBenchmark((std::string("BM_GluAct/") + name + (vector ? "/dispatch" : "/scalar")).c_str(),
                                   [kind, vector](benchmark::State& s) { BM_GluAct(s, kind, vector); })
          ->MinTime(0.1);
  // The probe again at the end, to show drift in the machine's load.
  register_per_threads("BM_ReadBandwidth_end", BM_ReadBandwidth, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
