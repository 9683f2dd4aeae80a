// Qwen3.8 (Gated DeltaNet + gated attention) through the DecodeProgram, on the
// committed transformers fixture tests/fixtures/qwen38_mini/: the 24 reference
// tokens are decoded one row per step by every executor; megakernel and
// op-by-op agree bit for bit, and each agrees with transformers' logits, final
// DeltaNet states, conv windows and cached keys/values within 1e-4 of the
// largest reference magnitude (f32 everywhere).
#include <gtest/gtest.h>

#include <unistd.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "exec/executor.h"
#include "exec/recurrent_kernels.h"
#include "io/safetensors.h"
#include "model/qwen38.h"
#include "test_util.h"
#include "model_state.h"

namespace megakern {
namespace {

const std::string& mini_dir() {
  static const std::string d = fixture_path("qwen38_mini");
  return d;
}

const nlohmann::json& reference() { return fixture_json("qwen38_mini/reference.json"); }

const Qwen38Model& mini() {
  static const std::unique_ptr<Qwen38Model> m = Qwen38Model::load(mini_dir());
  return *m;
}

struct DecodeRun {
  std::vector<float> logits;  // [T][V]
  KVCache cache;
  RecurrentState state;
};

DecodeRun decode(const Qwen38Model& m, Executor& ex, const std::vector<int32_t>& tokens) {
  DecodeRun r{{}, make_cache(m, 64), make_state(m)};
  const int V = m.config().vocab;
  r.logits.resize(tokens.size() * static_cast<size_t>(V));
  for (size_t t = 0; t < tokens.size(); ++t) {
    RowInput row{tokens[t], static_cast<int32_t>(t), &r.cache, &r.state};
    ex.step({row}, &r.logits[t * static_cast<size_t>(V)]);
  }
  return r;
}


// Copies the fixture checkpoint to dir under the "model.language_model."
// prefix (lm_head.weight kept), optionally with every tensor in dtype (BF16 or
// F64; "" keeps F32), and with
// the header padded so that the data buffer starts at an odd address offset:
// every tensor is then misaligned and the loader must copy it.
void rewrite_checkpoint(const std::filesystem::path& dir, const std::string& dtype) {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(mini_dir() + "/config.json", dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto src = SafetensorsFile::open(mini_dir() + "/model.safetensors");
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const SafetensorsTensor& t : src->tensors()) {
    std::string name = t.name;
    if (name.rfind("model.", 0) == 0) name = "model.language_model." + name.substr(6);
    std::string bytes;
    if (dtype == "BF16") {
      for (float x : to_f32(t)) {
        const uint16_t h = f32_to_bf16(x);
        bytes.append(reinterpret_cast<const char*>(&h), 2);
      }
    } else if (dtype == "F64") {
      for (float x : to_f32(t)) {
        const double d = x;
        bytes.append(reinterpret_cast<const char*>(&d), 8);
      }
    } else {
      bytes.assign(reinterpret_cast<const char*>(t.data), t.n_bytes);
    }
    header[name] = {{"dtype", dtype.empty() ? t.dtype : dtype},
                    {"shape", t.shape},
                    {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 4 != 1) h += ' ';
  const uint64_t n = h.size();
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

std::vector<int32_t> ref_tokens() { return reference()["tokens"].get<std::vector<int32_t>>(); }

TEST(Qwen38Model, LoadsMiniFixture) {
  const Qwen38Model& m = mini();
  const Qwen38Config& c = m.config();
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.vocab, 256);
  EXPECT_EQ(m.n_attention_layers(), 1);
  EXPECT_EQ(m.n_deltanet_layers(), 3);
  EXPECT_EQ(m.tensor_prefix(), "model.");
  const Qwen38Layer& a = m.layers()[3];
  ASSERT_TRUE(a.attention);
  EXPECT_EQ(a.wq.rows, c.n_head * c.head_dim);
  EXPECT_EQ(a.wgate.rows, c.n_head * c.head_dim);
  EXPECT_EQ(m.layers()[0].w_ba.rows, 2 * c.la_n_v_heads);
  const DecodeProgram p = build_qwen38_program(m, 4);
  EXPECT_NO_THROW(p.verify());
  EXPECT_TRUE(p.recurrent);
  const std::string d = p.dump();
  EXPECT_NE(d.find("delta_rule"), std::string::npos);
  EXPECT_NE(d.find("sigmoid_gate"), std::string::npos);
  DecodeProgram broken = p;
  broken.recurrent = false;  // recurrent ops need a recurrent program
  EXPECT_THROW(broken.verify(), std::logic_error);
  broken = p;
  for (Op& op : broken.ops)
    if (op.kind == OpKind::DeltaRule) op.as<ops::DeltaRule>().a_log = op.as<ops::DeltaRule>().a_log.first(1);  // A_log length
  EXPECT_THROW(broken.verify(), std::logic_error);
  RecurrentState s = make_state(m);
  EXPECT_EQ(static_cast<int64_t>(s.bytes()), recurrent_state_bytes(c).total());
}

TEST(Qwen38Model, ExecutorsMatchTransformers) {
  const Qwen38Model& m = mini();
  const Qwen38Config& c = m.config();
  const DecodeProgram prog = build_qwen38_program(m, 4);
  ThreadPool pool(2);
  const auto tokens = ref_tokens();
  const std::vector<float> ref_logits = flatten(reference()["logits"]);
  const std::vector<float> ref_state = flatten(reference()["delta_state"]);
  const std::vector<float> ref_conv = flatten(reference()["conv_window"]);
  const std::vector<float> ref_k = flatten(reference()["k_cache"]);
  const std::vector<float> ref_v = flatten(reference()["v_cache"]);
  const auto kv_pos = reference()["kv_positions"].get<std::vector<int>>();
  ASSERT_EQ(reference()["attn_layer"].get<int>(), 3);
  ASSERT_EQ(ref_logits.size(), tokens.size() * static_cast<size_t>(c.vocab));

  std::map<std::string, DecodeRun> runs;
  for (const char* kind : {"reference", "opbyop", "mega"}) {
    auto ex = make_executor(kind, prog, pool);
    DecodeRun r = decode(m, *ex, tokens);
    ASSERT_EQ(r.state.S.size(), ref_state.size());
    ASSERT_EQ(r.state.conv.size(), ref_conv.size());
    const double dl = rel_diff(r.logits.data(), ref_logits.data(), ref_logits.size());
    const double ds = rel_diff(r.state.S.data(), ref_state.data(), ref_state.size());
    const double dc = rel_diff(r.state.conv.data(), ref_conv.data(), ref_conv.size());
    std::vector<float> k, v;
    std::vector<float> krow(static_cast<size_t>(prog.kv_dim)), vrow(static_cast<size_t>(prog.kv_dim));
    for (int pos : kv_pos) {
      r.cache.load(0, pos, krow.data(), vrow.data());
      k.insert(k.end(), krow.begin(), krow.end());
      v.insert(v.end(), vrow.begin(), vrow.end());
    }
    const double dk = rel_diff(k.data(), ref_k.data(), ref_k.size());
    const double dv = rel_diff(v.data(), ref_v.data(), ref_v.size());
    std::printf("qwen3.8-mini %-9s vs transformers (max |diff| / max |ref|): logits %.3e, delta state %.3e, "
                "conv window %.3e, k %.3e, v %.3e\n",
                kind, dl, ds, dc, dk, dv);
    EXPECT_LT(dl, 1e-4) << kind;
    EXPECT_LT(ds, 1e-4) << kind;
    EXPECT_LT(dc, 1e-4) << kind;
    EXPECT_LT(dk, 1e-4) << kind;
    EXPECT_LT(dv, 1e-4) << kind;
    int top1 = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* a = &r.logits[t * c.vocab];
      const float* b = &ref_logits[t * c.vocab];
      top1 += std::max_element(a, a + c.vocab) - a == std::max_element(b, b + c.vocab) - b;
    }
    EXPECT_EQ(top1, static_cast<int>(tokens.size())) << kind;
    runs.emplace(kind, std::move(r));
  }
  const DecodeRun& a = runs.at("opbyop");
  const DecodeRun& b = runs.at("mega");
  ASSERT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), sizeof(float) * a.logits.size()));
  ASSERT_EQ(0, std::memcmp(a.state.S.data(), b.state.S.data(), sizeof(float) * a.state.S.size()));
  ASSERT_EQ(0, std::memcmp(a.state.conv.data(), b.state.conv.data(), sizeof(float) * a.state.conv.size()));
}

// Prefill in blocks: the 24 reference tokens as steps of 3, 8, 5, 1, 7 rows
// of one sequence (the conv window carried through each block in order, the
// delta rule in its chunked form), with a second sequence's single row in
// some of the same steps. Logits of every position, the final DeltaNet
// states and conv windows agree with step-by-step decode and with
// transformers within 1e-4 of the largest reference value; op-by-op and
// megakernel agree bit for bit, and the other sequence's row is bit for bit
// what it is alone.
TEST(Qwen38Model, ChunkedPrefillMatchesStepByStep) {
  const Qwen38Model& m = mini();
  const int V = m.config().vocab;
  const DecodeProgram prog = build_qwen38_program(m, 9);
  ThreadPool pool(2);
  const auto tokens = ref_tokens();
  const std::vector<float> ref_logits = flatten(reference()["logits"]);
  const std::vector<float> ref_state = flatten(reference()["delta_state"]);
  const std::vector<float> ref_conv = flatten(reference()["conv_window"]);
  auto step_ex = make_executor("opbyop", prog, pool);
  const DecodeRun stepwise = decode(m, *step_ex, tokens);
  const std::vector<int> blocks = {3, 8, 5, 1, 7};
  std::map<std::string, DecodeRun> runs;
  std::map<std::string, std::vector<float>> other_rows;
  for (const char* kind : {"reference", "opbyop", "mega"}) {
    auto ex = make_executor(kind, prog, pool);
    DecodeRun r{{}, make_cache(m, 64), make_state(m)};
    r.logits.resize(tokens.size() * static_cast<size_t>(V));
    KVCache oc = make_cache(m, 64);
    RecurrentState os = make_state(m);
    std::vector<float>& other = other_rows[kind];
    size_t t = 0;
    int other_pos = 0;
    for (size_t b = 0; b < blocks.size(); ++b) {
      std::vector<RowInput> rows;
      for (int i = 0; i < blocks[b]; ++i, ++t) rows.push_back({tokens[t], static_cast<int32_t>(t), &r.cache, &r.state});
      const bool with_other = b % 2 == 0;
      if (with_other) rows.push_back({tokens[static_cast<size_t>(other_pos)] , other_pos, &oc, &os});
      std::vector<float> out(rows.size() * static_cast<size_t>(V));
      ex->step(rows, out.data());
      std::copy_n(out.data(), static_cast<size_t>(blocks[b]) * V, &r.logits[(t - blocks[b]) * static_cast<size_t>(V)]);
      if (with_other) {
        other.insert(other.end(), out.end() - V, out.end());
        ++other_pos;
      }
    }
    const double dl = rel_diff(r.logits.data(), stepwise.logits.data(), stepwise.logits.size());
    const double ds = rel_diff(r.state.S.data(), stepwise.state.S.data(), stepwise.state.S.size());
    const double dt = rel_diff(r.logits.data(), ref_logits.data(), ref_logits.size());
    const double dts = rel_diff(r.state.S.data(), ref_state.data(), ref_state.size());
    std::printf("qwen3.8-mini %-9s blocks 3,8,5,1,7: vs step-by-step logits %.3e, state %.3e; vs transformers "
                "logits %.3e, state %.3e\n",
                kind, dl, ds, dt, dts);
    EXPECT_LT(dl, 1e-4) << kind;
    EXPECT_LT(ds, 1e-4) << kind;
    EXPECT_LT(dt, 1e-4) << kind;
    EXPECT_LT(dts, 1e-4) << kind;
    EXPECT_LT(rel_diff(r.state.conv.data(), stepwise.state.conv.data(), ref_conv.size()), 1e-4) << kind;
    EXPECT_LT(rel_diff(r.state.conv.data(), ref_conv.data(), ref_conv.size()), 1e-4) << kind;
    runs.emplace(kind, std::move(r));
  }
  const DecodeRun& a = runs.at("opbyop");
  const DecodeRun& b = runs.at("mega");
  EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), sizeof(float) * a.logits.size()));
  EXPECT_EQ(0, std::memcmp(a.state.S.data(), b.state.S.data(), sizeof(float) * a.state.S.size()));
  // The other sequence, one row per step next to the blocks: as decoded alone.
  const std::vector<float>& alone = stepwise.logits;
  for (const char* kind : {"opbyop", "mega"}) {
    const auto& o = other_rows.at(kind);
    ASSERT_EQ(o.size(), 3u * V);
    EXPECT_EQ(0, std::memcmp(o.data(), alone.data(), sizeof(float) * o.size())) << kind;
  }
}

// Strong gates: A_log raised so that each token decays the state by about
// e^-40, so that within a block the chunked form's decay factors fall through
// the subnormal range (e^-88 .. e^-103) and below; the delta rule runs with
// subnormals as zero (recurrent.cpp). The chunked prompt pass still matches
// step-by-step decoding, every executor's state stays finite, and the
// floating-point mode of the calling thread and of the pool's workers is as
// it was before.
TEST(Qwen38Model, StrongGatesChunkedMatchesStepByStepAndLeavesTheFpModeAlone) {
  const Qwen38Model& m = mini();
  const int V = m.config().vocab;
  DecodeProgram prog = build_qwen38_program(m, 16);
  std::vector<std::vector<float>> strong;
  for (Op& op : prog.ops)
    if (op.kind == OpKind::DeltaRule) {
      auto& d = op.as<ops::DeltaRule>();
      strong.emplace_back(d.a_log.size(), 4.0f);  // exp(4) ~ 55 times softplus(...)
      d.a_log = strong.back();
    }
  ASSERT_FALSE(strong.empty());
  ThreadPool pool(2);
  auto mxcsr = [&] {
    std::vector<unsigned> v(1 + static_cast<size_t>(pool.size()));
    v[0] = _mm_getcsr();
    pool.run([&](int w) { v[1 + static_cast<size_t>(w)] = _mm_getcsr(); });
    return v;
  };
  const std::vector<unsigned> before = mxcsr();
  const auto tokens = ref_tokens();
  auto step_ex = make_executor("opbyop", prog, pool);
  const DecodeRun stepwise = decode(m, *step_ex, tokens);
  for (const char* kind : {"reference", "opbyop", "mega"}) {
    auto ex = make_executor(kind, prog, pool);
    DecodeRun r{{}, make_cache(m, 64), make_state(m)};
    r.logits.resize(tokens.size() * static_cast<size_t>(V));
    for (size_t t = 0; t < tokens.size(); t += 16) {
      std::vector<RowInput> rows;
      for (size_t i = t; i < std::min(tokens.size(), t + 16); ++i)
        rows.push_back({tokens[i], static_cast<int32_t>(i), &r.cache, &r.state});
      ex->step(rows, &r.logits[t * static_cast<size_t>(V)]);
    }
    EXPECT_TRUE(std::all_of(r.state.S.begin(), r.state.S.end(), [](float x) { return std::isfinite(x); })) << kind;
    EXPECT_LT(rel_diff(r.logits.data(), stepwise.logits.data(), stepwise.logits.size()), 1e-4) << kind;
    EXPECT_LT(rel_diff(r.state.S.data(), stepwise.state.S.data(), stepwise.state.S.size()), 1e-4) << kind;
  }
  EXPECT_EQ(mxcsr(), before);
}

// Rows of different sequences in one step: each row's logits and state are
// those of its sequence decoded alone (bit for bit in opbyop and mega).
TEST(Qwen38Model, BatchedSequencesMatchAlone) {
  const Qwen38Model& m = mini();
  const int V = m.config().vocab;
  const DecodeProgram prog = build_qwen38_program(m, 4);
  ThreadPool pool(2);
  const auto tokens = ref_tokens();
  const int n_seq = 3, steps = 10;
  auto tok = [&](int s, int t) { return tokens[static_cast<size_t>((t * (s + 1) + 5 * s) % tokens.size())]; };
  for (const char* kind : {"reference", "opbyop", "mega"}) {
    auto ex = make_executor(kind, prog, pool);
    std::vector<KVCache> caches;
    std::vector<RecurrentState> states;
    for (int s = 0; s < n_seq; ++s) {
      caches.push_back(make_cache(m, 32));
      states.push_back(make_state(m));
    }
    // Sequence s starts s steps late, so rows sit at different positions.
    std::vector<std::vector<float>> batched(n_seq);
    std::vector<float> out(static_cast<size_t>(n_seq) * V);
    for (int step = 0; step < steps + n_seq - 1; ++step) {
      std::vector<RowInput> rows;
      std::vector<int> who;
      for (int s = 0; s < n_seq; ++s) {
        const int t = step - s;
        if (t < 0 || t >= steps) continue;
        rows.push_back({tok(s, t), t, &caches[static_cast<size_t>(s)], &states[static_cast<size_t>(s)]});
        who.push_back(s);
      }
      ex->step(rows, out.data());
      for (size_t i = 0; i < who.size(); ++i)
        batched[static_cast<size_t>(who[i])].insert(batched[static_cast<size_t>(who[i])].end(), &out[i * V],
                                                      &out[(i + 1) * V]);
    }
    for (int s = 0; s < n_seq; ++s) {
      KVCache c = make_cache(m, 32);
      RecurrentState st = make_state(m);
      std::vector<float> alone;
      std::vector<float> one(static_cast<size_t>(V));
      for (int t = 0; t < steps; ++t) {
        ex->step({{tok(s, t), t, &c, &st}}, one.data());
        alone.insert(alone.end(), one.begin(), one.end());
      }
      ASSERT_EQ(alone.size(), batched[static_cast<size_t>(s)].size());
      if (std::string(kind) == "reference") {
        EXPECT_LT(rel_diff(alone.data(), batched[static_cast<size_t>(s)].data(), alone.size()), 1e-6) << s;
      } else {
        EXPECT_EQ(0, std::memcmp(alone.data(), batched[static_cast<size_t>(s)].data(), sizeof(float) * alone.size()))
            << kind << " sequence " << s;
        EXPECT_EQ(0, std::memcmp(st.S.data(), states[static_cast<size_t>(s)].S.data(), sizeof(float) * st.S.size()))
            << kind << " sequence " << s;
      }
    }
  }
}

// The same weights under the multimodal checkpoints' "model.language_model."
// prefix, misaligned (copied at load), or in F64: identical logits. In BF16: mega ==
// op-by-op bit for bit, and close to the f32 reference.
TEST(Qwen38Model, PrefixMisalignedAndBf16Checkpoints) {
  namespace fs = std::filesystem;
  const fs::path base = fs::temp_directory_path() / fmt::format("mk_q38_ckpt_{}", ::getpid());
  const auto tokens = ref_tokens();
  const std::vector<float> ref_logits = flatten(reference()["logits"]);
  ThreadPool pool(2);
  const DecodeProgram p0 = build_qwen38_program(mini(), 2);
  auto mega0 = make_mega_executor(p0, pool);
  const DecodeRun want = decode(mini(), *mega0, tokens);
  {
    rewrite_checkpoint(base / "f32", "");
    auto m = Qwen38Model::load((base / "f32").string());
    EXPECT_EQ(m->tensor_prefix(), "model.language_model.");
    EXPECT_EQ(m->tok_embd().type, DType::F32);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m->lm_head().data) % 4, 0u);  // copied, aligned
    const DecodeProgram p = build_qwen38_program(*m, 2);
    auto mega = make_mega_executor(p, pool);
    const DecodeRun got = decode(*m, *mega, tokens);
    EXPECT_EQ(0, std::memcmp(got.logits.data(), want.logits.data(), sizeof(float) * want.logits.size()));
  }
  {
    // The published reference's checkpoint layout (qwen/load.py
    // load_canonical: model.language_model.* names) with the multimodal
    // config form, the text model's keys under text_config: the same logits.
    rewrite_checkpoint(base / "reflayout", "");
    nlohmann::json text;
    std::ifstream(mini_dir() + "/config.json") >> text;
    std::ofstream(base / "reflayout" / "config.json") << nlohmann::json({{"model_type", "qwen3_5"}, {"text_config", text}}).dump(2);
    auto m = Qwen38Model::load((base / "reflayout").string());
    EXPECT_EQ(m->tensor_prefix(), "model.language_model.");
    const DecodeProgram p = build_qwen38_program(*m, 2);
    auto mega = make_mega_executor(p, pool);
    const DecodeRun got = decode(*m, *mega, tokens);
    EXPECT_EQ(0, std::memcmp(got.logits.data(), want.logits.data(), sizeof(float) * want.logits.size()));
  }
  {
    // F64 is converted to F32 at load (exactly, here): identical logits.
    rewrite_checkpoint(base / "f64", "F64");
    auto m = Qwen38Model::load((base / "f64").string());
    EXPECT_EQ(m->layers()[3].wq.type, DType::F32);
    const DecodeProgram p = build_qwen38_program(*m, 2);
    auto mega = make_mega_executor(p, pool);
    const DecodeRun got = decode(*m, *mega, tokens);
    EXPECT_EQ(0, std::memcmp(got.logits.data(), want.logits.data(), sizeof(float) * want.logits.size()));
  }
  {
    rewrite_checkpoint(base / "bf16", "BF16");
    auto m = Qwen38Model::load((base / "bf16").string());
    EXPECT_EQ(m->tok_embd().type, DType::BF16);
    EXPECT_EQ(m->layers()[3].wq.type, DType::BF16);
    EXPECT_EQ(m->layers()[0].w_ba.type, DType::BF16);
    const DecodeProgram p = build_qwen38_program(*m, 2);
    auto mega = make_mega_executor(p, pool);
    auto obo = make_opbyop_executor(p, pool);
    auto ref = make_reference_executor(p);
    const DecodeRun a = decode(*m, *mega, tokens);
    const DecodeRun b = decode(*m, *obo, tokens);
    const DecodeRun r = decode(*m, *ref, tokens);
    EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), sizeof(float) * a.logits.size()));
    const double d_ref = rel_diff(a.logits.data(), r.logits.data(), r.logits.size());
    const double d_tf = rel_diff(a.logits.data(), ref_logits.data(), ref_logits.size());
    std::printf("qwen3.8-mini bf16 weights: mega vs scalar reference %.3e, vs transformers f32 %.3e\n", d_ref, d_tf);
    EXPECT_LT(d_ref, 1e-4);
    EXPECT_LT(d_tf, 3e-2);  // bf16 rounding of every weight (2^-9 relative)
  }
  fs::remove_all(base);
}

TEST(Qwen38Model, BadRowsAreRejected) {
  const Qwen38Model& m = mini();
  const DecodeProgram prog = build_qwen38_program(m, 4);
  ThreadPool pool(2);
  auto mega = make_mega_executor(prog, pool);
  KVCache c = make_cache(m, 8), c2 = make_cache(m, 8);
  RecurrentState s = make_state(m), s2 = make_state(m);
  std::vector<float> out(static_cast<size_t>(4) * m.config().vocab);
  EXPECT_THROW(mega->step({{1, 0, &c}}, out.data()), Error);  // no state
  EXPECT_THROW(mega->step({{1, 0, &c, &s}, {2, 1, &c2, &s}}, out.data()), Error);  // state shared, cache not
  EXPECT_THROW(mega->step({{1, 0, &c, &s}, {2, 1, &c, &s2}}, out.data()), Error);  // cache shared, state not
  EXPECT_THROW(mega->step({{1, 0, &c, &s}, {1, 0, &c2, &s2}, {2, 1, &c, &s}}, out.data()), Error);  // not adjacent
  EXPECT_THROW(mega->step({{1, 0, &c, &s}, {2, 2, &c, &s}}, out.data()), Error);  // positions not consecutive
  RowInput chained_block_row{2, 1, &c, &s};
  chained_block_row.state_in = &s2;  // a block's later row cannot start elsewhere
  EXPECT_THROW(mega->step({{1, 0, &c, &s}, chained_block_row}, out.data()), Error);
  RowInput stray{1, 0, &c2, &s2};
  stray.state_in = &s;  // starts from another sequence's state
  EXPECT_THROW(mega->step({{1, 0, &c, &s}, stray}, out.data()), Error);
  RecurrentState wrong(1, 8, 3, 2, 4, 4);
  EXPECT_THROW(mega->step({{1, 0, &c, &wrong}}, out.data()), Error);
  EXPECT_NO_THROW(mega->step({{1, 0, &c, &s}}, out.data()));
}

TEST(Qwen38Model, LoadErrorsAreClear) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("mk_q38_{}", ::getpid());
  fs::create_directories(dir);
  // A config whose layer count the checkpoint does not match: the missing
  // tensor is named.
  {
    std::ifstream f(mini_dir() + "/config.json");
    nlohmann::json j = nlohmann::json::parse(f);
    j["num_hidden_layers"] = 8;
    j["layer_types"] = nlohmann::json::array();
    for (int l = 0; l < 8; ++l) j["layer_types"].push_back(l % 4 == 3 ? "full_attention" : "linear_attention");
    std::ofstream(dir / "config.json") << j.dump();
    fs::copy_file(mini_dir() + "/model.safetensors", dir / "model.safetensors", fs::copy_options::overwrite_existing);
    try {
      Qwen38Model::load(dir.string());
      ADD_FAILURE() << "loaded a checkpoint with missing layers";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("model.layers.4."), std::string::npos) << e.what();
    }
  }
  // A wider hidden size: the shape mismatch is named.
  {
    std::ifstream f(mini_dir() + "/config.json");
    nlohmann::json j = nlohmann::json::parse(f);
    j["intermediate_size"] = 192;
    std::ofstream(dir / "config.json") << j.dump();
    try {
      Qwen38Model::load(dir.string());
      ADD_FAILURE() << "loaded a checkpoint with the wrong MLP width";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megakern
