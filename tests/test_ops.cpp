// Every registered op (ops/registry.h), alone in a small program, over a few
// shapes each (odd widths, tails, widths that are no multiple of a vector),
// one or three rows as separate sequences or as one sequence's block, run by
// every executor (reference, op-by-op, megakernel, the serial schedule
// interpreter) in both numerics modes. The oracle is the op's scalar
// reference tile (the reference executor): the serial interpreter with the
// reference tiles gives its bits; op-by-op, megakernel and the serial
// interpreter with the fast tiles give identical bits to each other and
// agree with it within the mode's tolerance; the schedules compiled for each
// program pass check_schedule. A kind without a harness entry fails
// RegistryIsCovered.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "core/thread_pool.h"
#include "dist/local_comm.h"
#include "exec/executor.h"
#include "exec/recurrent_kernels.h"
#include "exec/schedule.h"
#include "ir/expert_bank.h"
#include "ops/registry.h"

namespace megakern {
namespace {

constexpr int kVocab = 11;

// A program around one op: inputs written by Embed ops from random tables,
// the op, and taps of what it wrote; plus the owners of its data.
struct Rig {
  DecodeProgram p;
  std::deque<std::vector<float>> floats;
  std::deque<std::vector<uint8_t>> bytes;
  std::deque<ExpertBank> banks;
  uint32_t seed = 1;
  // Per-sequence state the program needs (conv and delta-rule shapes).
  int conv_dim = 0, conv_hist = 0, heads = 0, v_dim = 0, k_dim = 0;

  Rig() {
    p.model_name = "op-test";
    p.n_layer = 1;
    p.max_rows = 3;
    p.n_vocab = kVocab;
  }
  float rnd() {
    seed = seed * 1664525u + 1013904223u;
    return static_cast<float>((seed >> 9) & 0xffff) / 32768.f - 1.f;
  }
  std::span<const float> vec(size_t n, float scale = 1.f, float offset = 0.f) {
    auto& v = floats.emplace_back(n);
    for (auto& x : v) x = offset + scale * rnd();
    return v;
  }
  MatView mat(int64_t rows, int64_t cols, DType t = DType::F32) {
    const auto w = vec(static_cast<size_t>(rows * cols), 0.5f);
    const auto& tr = dtype_traits(t);
    MatView m;
    m.type = t;
    m.rows = rows;
    m.cols = cols;
    m.row_bytes = row_bytes(t, cols);
    auto& b = bytes.emplace_back(m.row_bytes * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) tr.quantize(w.data() + r * cols, b.data() + r * m.row_bytes, cols);
    m.data = b.data();
    return m;
  }
  // A slot written from a random table by the row's token.
  int input(const std::string& name, int width, float scale = 1.f) {
    const int s = p.add_slot(name, -1, width);
    Op& e = p.add_op(OpKind::Embed, -1, "in_" + name);
    e.mat = mat(kVocab, width);
    e.out = s;
    e.as<ops::Embed>().scale = scale;
    return s;
  }
  Op& op(OpKind k, int in = -1, int in2 = -1, int out = -1) {
    Op& o = p.add_op(k, 0, "under_test");
    o.in = in;
    o.in2 = in2;
    o.out = out;
    return o;
  }
  void tap(int slot) {
    Op& t = p.add_op(OpKind::Tap, 0, "probe");
    t.in = slot;
    t.as<ops::Tap>().offset = p.tap_width;
    p.tap_width += p.slots[static_cast<size_t>(slot)].width;
  }
  // Closes the program: a logits slot, and the verify.
  void finish() {
    p.logits_slot = input("logits", kVocab);
    p.verify();
  }
};

// The harness: per kind, its shapes (each builds a rig).
using Build = std::function<void(Rig&)>;
std::map<OpKind, std::vector<Build>> harness() {
  std::map<OpKind, std::vector<Build>> h;
  h[OpKind::Embed] = {[](Rig& r) { r.tap(r.input("x", 7, 0.5f)); },
                      [](Rig& r) {
                        const int s = r.p.add_slot("x", -1, 64);
                        Op& e = r.op(OpKind::Embed, -1, -1, s);
                        e.mat = r.mat(kVocab, 64, DType::Q8_0);
                        r.tap(s);
                      }};
  for (int w : {1, 7, 33, 67})
    h[OpKind::RmsNorm].push_back([w](Rig& r) {
      const int x = r.input("x", w), y = r.p.add_slot("y", -1, w);
      r.op(OpKind::RmsNorm, x, -1, y).as<ops::RmsNorm>() = {r.vec(static_cast<size_t>(w)), 1e-5f};
      r.tap(y);
    });
  for (auto [rows, cols, t] : {std::tuple{1, 33, DType::F32}, {5, 7, DType::F32}, {37, 64, DType::Q8_0},
                               {13, 96, DType::Q4_0}, {9, 256, DType::Q4_K}})
    h[OpKind::MatMul].push_back([rows, cols, t](Rig& r) {
      const int x = r.input("x", cols), y = r.p.add_slot("y", -1, rows);
      r.op(OpKind::MatMul, x, -1, y).mat = r.mat(rows, cols, t);
      r.tap(y);
    });
  for (auto [nh, hd, rd, neox, norm] : {std::tuple{3, 8, 8, false, true}, {2, 10, 6, true, false}, {1, 7, 0, true, true}})
    h[OpKind::HeadNormRope].push_back([nh, hd, rd, neox, norm](Rig& r) {
      const int x = r.input("x", nh * hd);
      auto& a = r.op(OpKind::HeadNormRope, -1, -1, x).as<ops::HeadNormRope>();
      a = {nh, hd, rd, 500.f, neox, norm ? r.vec(static_cast<size_t>(hd)) : std::span<const float>{}, 1e-6f};
      r.tap(x);
    });
  // Attention programs: k and v stored, then attention over the cache.
  auto attention = [](int nh, int nkv, int hd, int vd, int window, bool attend, bool sinks = false) {
    return [=](Rig& r) {
      r.p.kv_dim = nkv * hd;
      r.p.v_dim = vd > 0 ? nkv * vd : 0;
      const int q = r.input("q", nh * hd), k = r.input("k", nkv * hd), v = r.input("v", r.p.v_width());
      const int marker = r.p.add_slot("kv_cache", 0, 0);
      r.op(OpKind::StoreKV, k, v, marker);
      if (!attend) return;
      const int att = r.p.add_slot("att", -1, nh * (vd > 0 ? vd : hd));
      auto& a = r.op(OpKind::Attention, q, marker, att).as<ops::Attention>();
      a.n_head = nh;
      a.n_head_kv = nkv;
      a.head_dim = hd;
      a.v_head_dim = vd;
      a.scale = 0.4f;
      a.window = window;
      if (sinks) a.sinks = r.vec(static_cast<size_t>(nh), 1.5f);
      r.tap(att);
    };
  };
  h[OpKind::StoreKV] = {attention(2, 1, 5, 0, 0, false), attention(4, 2, 8, 3, 0, false)};
  h[OpKind::Attention] = {attention(4, 2, 8, 0, 0, true), attention(3, 1, 6, 0, 2, true), attention(6, 3, 5, 7, 0, true),
                          attention(2, 2, 33, 0, 0, true), attention(4, 2, 8, 0, 3, true, true)};
  for (auto [w, act] : {std::pair{7, GluKind::SiLU}, {33, GluKind::GeluTanh}, {67, GluKind::SiTU}})
    h[OpKind::GluAct].push_back([w, act](Rig& r) {
      const int g = r.input("g", w, 3.f), u = r.input("u", w), o = r.p.add_slot("o", -1, w);
      r.op(OpKind::GluAct, g, u, o).as<ops::GluAct>().act = act;
      r.tap(o);
    });
  for (auto [w, norm] : {std::pair{7, false}, {33, true}})
    h[OpKind::Residual].push_back([w, norm](Rig& r) {
      const int x = r.input("x", w), in = r.input("in", w);
      r.op(OpKind::Residual, in, -1, x).as<ops::Residual>() = {norm ? r.vec(static_cast<size_t>(w)) : std::span<const float>{}, 1e-6f};
      r.tap(x);
    });
  for (int w : {5, 33})
    h[OpKind::SigmoidGate].push_back([w](Rig& r) {
      const int o = r.input("o", w), g = r.input("g", w, 4.f);
      r.op(OpKind::SigmoidGate, g, -1, o);
      r.tap(o);
    });
  for (auto [C, K] : {std::pair{7, 4}, {33, 2}, {9, 1}})
    h[OpKind::CausalConvSilu].push_back([C, K](Rig& r) {
      r.p.recurrent = true;
      r.conv_dim = C;
      r.conv_hist = K - 1;
      const int x = r.input("x", C);
      auto& a = r.op(OpKind::CausalConvSilu, -1, -1, x).as<ops::CausalConvSilu>();
      a.taps = r.vec(static_cast<size_t>(C * K));
      r.tap(x);
    });
  for (auto [hv, hk, dv, dk, kda] : {std::tuple{2, 1, 4, 6, false}, {4, 2, 3, 5, false}, {2, 2, 5, 5, true}, {3, 3, 7, 7, true}})
    h[OpKind::DeltaRule].push_back([hv, hk, dv, dk, kda](Rig& r) {
      r.p.recurrent = true;
      r.heads = hv;
      r.v_dim = dv;
      r.k_dim = dk;
      const int qkv = r.input("qkv", 2 * hk * dk + hv * dv), o = r.p.add_slot("o", -1, hv * dv);
      const int g = r.input("g", kda ? hv * dk : 2 * hv), b = kda ? r.input("beta", hv) : -1;
      Op& op = r.op(OpKind::DeltaRule, qkv, g, o);
      op.in3 = b;
      auto& a = op.as<ops::DeltaRule>();
      a.n_head = hv;
      a.n_head_kv = hk;
      a.head_dim = dv;
      a.scale = 0.3f;
      a.kda = kda;
      a.a_log = r.vec(static_cast<size_t>(hv), 0.5f, -1.f);
      a.dt_bias = r.vec(static_cast<size_t>(kda ? hv * dk : hv), 0.5f);
      r.tap(o);
    });
  for (auto [nh, hd, gate] : {std::tuple{2, 5, GluKind::SiLU}, {3, 7, GluKind::Sigmoid}, {1, 33, GluKind::SiLU}})
    h[OpKind::GatedRmsNorm].push_back([nh, hd, gate](Rig& r) {
      const int o = r.input("o", nh * hd), z = r.input("z", nh * hd, 3.f);
      auto& a = r.op(OpKind::GatedRmsNorm, z, -1, o).as<ops::GatedRmsNorm>();
      a = {nh, hd, r.vec(static_cast<size_t>(hd)), 1e-6f, gate};
      r.tap(o);
    });
  for (auto [w, parts] : {std::pair{7, 2}, {33, 3}})
    h[OpKind::GatedResidual].push_back([w, parts](Rig& r) {
      const int s = r.input("s", w), x = r.input("x", w);
      r.op(OpKind::GatedResidual, x, -1, s).as<ops::GatedResidual>() = {r.vec(static_cast<size_t>(parts * w)), 1e-8f};
      r.tap(s);
    });
  for (auto [nh, hd, per_head, weight] : {std::tuple{2, 5, true, true}, {3, 7, false, false}, {2, 33, false, true}})
    h[OpKind::HeadNormGate].push_back([nh, hd, per_head, weight](Rig& r) {
      const int o = r.input("o", nh * hd), g = r.input("g", per_head ? nh : nh * hd, 3.f);
      auto& a = r.op(OpKind::HeadNormGate, g, -1, o).as<ops::HeadNormGate>();
      a = {nh, hd, weight ? r.vec(static_cast<size_t>(hd)) : std::span<const float>{}, 1e-5f};
      r.tap(o);
    });
  for (auto [w, mask] : {std::pair{7, false}, {33, true}})
    h[OpKind::LogitSoftcap].push_back([w, mask](Rig& r) {
      const int x = r.input("x", w, 40.f);
      auto& a = r.op(OpKind::LogitSoftcap, -1, -1, x).as<ops::LogitSoftcap>();
      a.cap = 15.f;
      a.scale = 0.7f;
      if (mask) {
        auto& m = r.floats.emplace_back(static_cast<size_t>(w), 0.f);
        m[3] = -INFINITY;
        m[10] = -2.5f;
        a.mask = m;
      }
      r.tap(x);
    });
  auto route = [](Rig& r, int E, int k, bool bias, bool softmax_selected = false) {
    const int logits = r.input("router", E, 2.f), rt = r.p.add_slot("route", -1, 2 * k);
    Op& o = r.p.add_op(OpKind::MoeRoute, 0, "route");
    o.in = logits;
    o.out = rt;
    o.as<ops::MoeRoute>() = {k, 0.8f, 1e-6f, bias ? r.vec(static_cast<size_t>(E), 0.2f) : std::span<const float>{}};
    o.as<ops::MoeRoute>().softmax_selected = softmax_selected;
    return rt;
  };
  for (auto [E, k, bias] : {std::tuple{6, 2, true}, {9, 3, false}, {4, 1, false}})
    h[OpKind::MoeRoute].push_back([=](Rig& r) { r.tap(route(r, E, k, bias)); });
  h[OpKind::MoeRoute].push_back([=](Rig& r) { r.tap(route(r, 8, 2, false, true)); });
  // Expert ops: a bank of E experts; MoeGlu, MoeDown or MoeCombine fed by a route.
  auto experts = [route](OpKind kind, int E, int k, int D, int F, DType t, ExpertAct act, bool scales,
                         bool biases = false) {
    return [=](Rig& r) {
      ExpertBank& b = r.banks.emplace_back();
      b.n_expert = E;
      b.d_in = D;
      b.d_ff = F;
      b.act = act;
      for (int e = 0; e < E; ++e) {
        b.gate.push_back(r.mat(F, D, t));
        b.up.push_back(r.mat(F, D, t));
        b.down.push_back(r.mat(D, F, t));
      }
      if (scales)
        for (auto* s : {&b.gate_scale, &b.up_scale, &b.down_scale}) {
          const auto v = r.vec(static_cast<size_t>(E), 0.25f, 1.f);
          s->assign(v.begin(), v.end());
        }
      if (scales) {
        const auto v = r.vec(static_cast<size_t>(D), 0.5f, 1.f);
        b.out_norm.assign(v.begin(), v.end());
      }
      if (biases) {
        for (auto [dst, n] : {std::pair{&b.gate_bias, E * F}, {&b.up_bias, E * F}, {&b.down_bias, E * D}}) {
          const auto v = r.vec(static_cast<size_t>(n), 2.f);
          dst->assign(v.begin(), v.end());
        }
      }
      const int rt = route(r, E, k, false);
      const int in_w = kind == OpKind::MoeGlu ? D : kind == OpKind::MoeDown ? k * F : k * D;
      const int out_w = kind == OpKind::MoeGlu ? k * F : kind == OpKind::MoeDown ? k * D : D;
      const int in = r.input("x", in_w), out = r.p.add_slot("y", -1, out_w);
      Op& o = r.op(kind, in, rt, out);
      const ops::MoeExperts x{k, &b};
      if (kind == OpKind::MoeGlu) o.params = ops::MoeGlu{x};
      if (kind == OpKind::MoeDown) o.params = ops::MoeDown{x};
      if (kind == OpKind::MoeCombine) o.params = ops::MoeCombine{x};
      r.tap(out);
    };
  };
  for (OpKind kind : {OpKind::MoeGlu, OpKind::MoeDown, OpKind::MoeCombine}) {
    h[kind].push_back(experts(kind, 4, 2, 7, 9, DType::F32, ExpertAct::SwiGLU, false));
    h[kind].push_back(experts(kind, 5, 3, 64, 32, DType::Q8_0, ExpertAct::SiTU, true));
    h[kind].push_back(experts(kind, 6, 2, 64, 32, DType::MXFP4, ExpertAct::SwiGluOai, false, true));
  }
  for (auto [H, blocks, n] : {std::tuple{7, 2, 1}, {33, 4, 3}})
    h[OpKind::AttnResMix].push_back([H, blocks, n](Rig& r) {
      const int res = r.input("res", blocks * H), mix = r.p.add_slot("mix", -1, H);
      r.op(OpKind::AttnResMix, res, -1, mix).as<ops::AttnResMix>() = {n, r.vec(static_cast<size_t>(H)), 1e-6f};
      r.tap(mix);
    });
  for (auto [H, blocks, block, overwrite] : {std::tuple{7, 2, 0, true}, {33, 4, 2, false}})
    h[OpKind::AttnResAdd].push_back([H, blocks, block, overwrite](Rig& r) {
      const int res = r.input("res", blocks * H), in = r.input("in", H);
      r.op(OpKind::AttnResAdd, in, -1, res).as<ops::AttnResAdd>() = {block, overwrite};
      r.tap(res);
    });
  for (auto [nh, own, shared] : {std::tuple{2, 3, 5}, {3, 8, 1}})
    h[OpKind::MlaKey].push_back([nh, own, shared](Rig& r) {
      const int kn = r.input("k_nope", nh * own), ke = r.input("k_extra", shared), k = r.p.add_slot("k", -1, nh * (own + shared));
      r.op(OpKind::MlaKey, kn, ke, k).as<ops::MlaKey>() = {nh, own + shared};
      r.tap(k);
    });
  // A group of one rank: the reduction is a copy, the gather too (several
  // ranks: tests/test_dist.cpp).
  static LocalGroup solo(1);
  for (int w : {7, 33}) {
    h[OpKind::AllReduce].push_back([w](Rig& r) {
      const int in = r.input("part", w), out = r.p.add_slot("sum", -1, w);
      r.op(OpKind::AllReduce, in, -1, out).as<ops::AllReduce>().comm = &solo.rank(0);
      r.tap(out);
    });
    h[OpKind::AllGather].push_back([w](Rig& r) {
      const int in = r.input("share", w), out = r.p.add_slot("all", -1, w);
      r.op(OpKind::AllGather, in, -1, out).as<ops::AllGather>().comm = &solo.rank(0);
      r.tap(out);
    });
  }
  for (int w : {7, 33})
    h[OpKind::Tap].push_back([w](Rig& r) {
      r.tap(r.input("pad", 3));
      r.tap(r.input("x", w));
    });
  return h;
}

// Everything a run leaves: taps and logits of each step, then the caches and states.
std::vector<float> run(const Rig& rig, const DecodeProgram& p, Executor& ex, int n_rows, bool one_sequence) {
  const int n_seq = one_sequence ? 1 : n_rows;
  std::vector<KVCache> caches(static_cast<size_t>(n_seq));
  std::vector<RecurrentState> states;
  for (auto& c : caches) {
    c.n_ctx = 16;
    c.n_layer = 1;
    c.kv_dim = p.kv_dim;
    c.v_dim = p.v_dim;
    c.k.assign(static_cast<size_t>(c.n_ctx) * p.kv_dim, 0.f);
    c.v.assign(static_cast<size_t>(c.n_ctx) * p.v_width(), 0.f);
    if (p.recurrent) states.emplace_back(1, rig.conv_dim, rig.conv_hist, rig.heads, rig.v_dim, rig.k_dim);
  }
  std::vector<float> out, taps(static_cast<size_t>(n_rows * std::max(p.tap_width, 1))),
      logits(static_cast<size_t>(n_rows * p.n_vocab));
  ex.set_tap_output(p.tap_width > 0 ? taps.data() : nullptr);
  for (int step = 0; step < 3; ++step) {
    std::vector<RowInput> rows;
    for (int r = 0; r < n_rows; ++r) {
      const int s = one_sequence ? 0 : r;
      RowInput in;
      in.token = (step * 7 + r * 5 + 1) % p.n_vocab;
      in.pos = one_sequence ? step * n_rows + r : step + 2 * r;
      in.cache = &caches[static_cast<size_t>(s)];
      in.state = p.recurrent ? &states[static_cast<size_t>(s)] : nullptr;
      rows.push_back(in);
    }
    ex.step(rows, logits.data());
    out.insert(out.end(), taps.begin(), taps.end());
    out.insert(out.end(), logits.begin(), logits.end());
  }
  for (auto& c : caches) {
    out.insert(out.end(), c.k.data(), c.k.data() + c.k.size());
    out.insert(out.end(), c.v.data(), c.v.data() + c.v.size());
  }
  for (auto& s : states) {
    out.insert(out.end(), s.conv.begin(), s.conv.end());
    out.insert(out.end(), s.S.begin(), s.S.end());
  }
  return out;
}

// Largest difference relative to the largest reference value (equal values,
// infinities included, count as no difference).
double rel_diff(const std::vector<float>& a, const std::vector<float>& ref) {
  double d = 0, m = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isfinite(ref[i])) m = std::max(m, static_cast<double>(std::fabs(ref[i])));
    if (a[i] == ref[i]) continue;
    d = std::max(d, std::isfinite(a[i]) && std::isfinite(ref[i]) ? static_cast<double>(std::fabs(a[i] - ref[i]))
                                                                   : INFINITY);
  }
  return d / m;
}

TEST(Ops, RegistryIsCovered) {
  const auto h = harness();
  for (int k = 0; k < kOpKinds; ++k) {
    const OpKind kind = static_cast<OpKind>(k);
    const OpInfo& info = op_info(kind);
    EXPECT_STREQ(op_kind_name(kind), info.name);
    EXPECT_TRUE(info.ref && info.fast && info.verify) << info.name << ": entry without tiles or verify";
    auto it = h.find(kind);
    EXPECT_TRUE(it != h.end() && !it->second.empty()) << info.name << " has no entry in tests/test_ops.cpp";
  }
}

TEST(Ops, EveryOpEveryShapeEveryExecutorEveryMode) {
  ThreadPool pool(2, /*oversubscribe=*/true);
  int cases = 0;
  for (const auto& [kind, builds] : harness()) {
    for (size_t shape = 0; shape < builds.size(); ++shape) {
      Rig rig;
      builds[shape](rig);
      rig.finish();
      const OpInfo& info = op_info(kind);
      for (int n_rows : {1, 3})
        for (bool one_sequence : {false, true}) {
          if (one_sequence && n_rows == 1) continue;
          SCOPED_TRACE(fmt::format("{} shape {} rows {}{}", info.name, shape, n_rows, one_sequence ? " (one sequence)" : ""));
          DecodeProgram p = rig.p;
          CompileOptions chained;
          chained.chained = true;
          ASSERT_NO_THROW(check_schedule(p, compile(p, n_rows, 3)));
          if (p.recurrent) ASSERT_NO_THROW(check_schedule(p, compile(p, n_rows, 2, chained)));
          auto ref_ex = make_reference_executor(p);
          const auto ref = run(rig, p, *ref_ex, n_rows, one_sequence);
          SerialExecutor ref_serial(p, 1, true);
          ASSERT_EQ(0, std::memcmp(ref.data(), run(rig, p, ref_serial, n_rows, one_sequence).data(), sizeof(float) * ref.size()))
              << "serial interpreter with the reference tiles";
          for (Numerics mode : {Numerics::Exact, Numerics::Fast}) {
            p.numerics = mode;
            auto obo = make_opbyop_executor(p, pool);
            auto mega = make_mega_executor(p, pool);
            SerialExecutor serial(p, 3, false);
            const auto a = run(rig, p, *obo, n_rows, one_sequence);
            const auto b = run(rig, p, *mega, n_rows, one_sequence);
            const auto c = run(rig, p, serial, n_rows, one_sequence);
            ASSERT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.size())) << "megakernel vs op-by-op";
            // Tiles are cut per team size; no result depends on it.
            ASSERT_EQ(0, std::memcmp(a.data(), c.data(), sizeof(float) * a.size())) << "serial (3 workers) vs op-by-op";
            // Fast tiles: vector exp / tanh and other summation orders
            // (1e-5); fast numerics: 8-bit activations into the products.
            const double tol = mode == Numerics::Exact ? 2e-5 : 3e-2;
            EXPECT_LT(rel_diff(a, ref), tol) << numerics_name(mode);
          }
          ++cases;
        }
    }
  }
  std::printf("[ops] %d cases\n", cases);
}

}  // namespace
}  // namespace megakern
