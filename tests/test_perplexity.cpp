// `megakern perplexity` end to end: the reported PPL against the saved
// log-probabilities (read here with a reader of our own, from the format
// documented in tools/cmd_perplexity.cpp), the KL report of a run against
// itself and, recomputed here, of a fast-mode run against an exact one, the
// executor-step path against the batched pass (the same bits), BOS at every
// chunk's start (Gemma 3), refusal of mismatching base files, and
// `--weights f32` on a GGUF file as the exact mode's base (KL ~1e-7).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace megakern {
namespace {

std::string gpl_text() { return std::string(MEGAKERN_SOURCE_DIR) + "/bench/data/gpl-3.0.txt"; }

struct CliRun {
  int status = -1;
  std::string out;
};
CliRun run(const std::string& args) {
  const CliResult c = run_cli(args);
  return {c.status, c.out + c.err};
}

// The number after `key` in text (NaN when absent).
double number_after(const std::string& text, const std::string& key) {
  const size_t p = text.find(key);
  if (p == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + p + key.size(), nullptr);
}

struct SavedLogProbs {
  uint32_t n_vocab = 0, n_ctx = 0, n_chunks = 0, n_scored = 0;
  std::string name;
  std::vector<int32_t> tokens;
  std::vector<float> logp;  // [n_chunks][n_scored][n_vocab]
};

SavedLogProbs read_saved(const std::string& path) {
  SavedLogProbs s;
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), "MKLOGPRB");
  uint32_t h[6];
  in.read(reinterpret_cast<char*>(h), sizeof h);
  EXPECT_EQ(h[0], 1u);
  s.n_vocab = h[1];
  s.n_ctx = h[2];
  s.n_chunks = h[3];
  s.n_scored = h[4];
  s.name.resize(h[5]);
  in.read(s.name.data(), h[5]);
  s.tokens.resize(size_t{s.n_chunks} * s.n_ctx);
  in.read(reinterpret_cast<char*>(s.tokens.data()), static_cast<std::streamsize>(s.tokens.size() * 4));
  s.logp.resize(size_t{s.n_chunks} * s.n_scored * s.n_vocab);
  in.read(reinterpret_cast<char*>(s.logp.data()), static_cast<std::streamsize>(s.logp.size() * 4));
  EXPECT_TRUE(in.good()) << path << " is shorter than its header says";
  in.peek();
  EXPECT_TRUE(in.eof()) << path << " has bytes after the last row";
  return s;
}

TEST(Perplexity, PplIsExpOfTheMeanNllOfTheSavedLogProbs) {
  TempDir dir;
  const std::string saved = dir.path + "/base.bin";
  const CliRun r = run("perplexity -m dense-mini -f " + gpl_text() + " -c 64 --chunks 3 -t 2 --save-logits " + saved);
  ASSERT_EQ(r.status, 0) << r.out;
  const double ppl = number_after(r.out, "PPL = ");
  ASSERT_TRUE(std::isfinite(ppl) && ppl > 1) << r.out;

  const SavedLogProbs s = read_saved(saved);
  ASSERT_EQ(s.n_ctx, 64u);
  ASSERT_EQ(s.n_chunks, 3u);
  ASSERT_EQ(s.n_scored, 31u);  // positions 32..62 predict tokens 33..63
  EXPECT_EQ(s.name, "dense-mini");
  // dense-mini reads bytes: the tokens are the text's first 192 bytes.
  std::ifstream text(gpl_text(), std::ios::binary);
  std::string head(192, '\0');
  text.read(head.data(), 192);
  double nll = 0;
  size_t n = 0;
  for (uint32_t c = 0; c < s.n_chunks; ++c) {
    for (uint32_t i = 0; i < s.n_scored; ++i) {
      const float* row = &s.logp[(size_t{c} * s.n_scored + i) * s.n_vocab];
      // Each row is a log-softmax: its probabilities sum to one.
      double z = 0;
      for (uint32_t v = 0; v < s.n_vocab; ++v) z += std::exp(static_cast<double>(row[v]));
      ASSERT_NEAR(z, 1.0, 1e-4) << "chunk " << c << " row " << i;
      const int32_t next = s.tokens[size_t{c} * s.n_ctx + s.n_ctx / 2 + i + 1];
      ASSERT_GE(next, 0);
      ASSERT_LT(static_cast<uint32_t>(next), s.n_vocab);
      nll -= row[next];
      ++n;
    }
  }
  EXPECT_NEAR(ppl, std::exp(nll / static_cast<double>(n)), 1e-5 * ppl) << r.out;
  // The byte tokenizer maps the text byte for byte (no BOS), so the stored
  // tokens are the text itself.
  for (size_t i = 0; i < 192; ++i) ASSERT_EQ(s.tokens[i], static_cast<unsigned char>(head[i]) + 0) << i;
}

TEST(Perplexity, ARunAgainstItselfHasZeroKlAndFullTopOneAgreement) {
  TempDir dir;
  const std::string saved = dir.path + "/base.bin";
  const std::string common = "perplexity -m dense-mini -f " + gpl_text() + " -c 64 --chunks 2 -t 2 ";
  ASSERT_EQ(run(common + "--save-logits " + saved).status, 0);
  const CliRun r = run(common + "--kl-base " + saved);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(number_after(r.out, "KL divergence mean   = "), 0.0) << r.out;
  EXPECT_EQ(number_after(r.out, "KL divergence p99    = "), 0.0) << r.out;
  EXPECT_EQ(number_after(r.out, "same top-1           = "), 100.0) << r.out;
  EXPECT_EQ(number_after(r.out, "PPL(this)/PPL(base)  = "), 1.0) << r.out;
  EXPECT_DOUBLE_EQ(number_after(r.out, "PPL(base)            = "), number_after(r.out, "Final estimate: PPL = "));

  // The fast mode differs from the exact one, and the report says so.
  const CliRun f = run(common + "--numerics fast --kl-base " + saved);
  ASSERT_EQ(f.status, 0) << f.out;
  EXPECT_GT(number_after(f.out, "KL divergence mean   = "), 0.0) << f.out;
}

// The default pass (128-row megakernel steps, the unscored half of each
// chunk without the output head) and full-program steps of 16 rows on the
// op-by-op and megakernel executors are the same arithmetic (a row's result
// does not depend on its step), so their saved log-probabilities are the
// same bits. The reference executor
// runs the scalar kernels (its vector ops sum in another order): measured
// KL max 6.6e-8 here, held to 1e-6 with the same top-1.
TEST(Perplexity, ExecutorStepsAgreeWithTheBatchedPass) {
  TempDir dir;
  const std::string saved = dir.path + "/batched.bin";
  const std::string common = "perplexity -m dense-mini -f " + gpl_text() + " -c 48 --chunks 2 -t 2 ";
  const CliRun b = run(common + "--save-logits " + saved);
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("executor steps (mega, 128 rows; unscored positions without the output head)"),
            std::string::npos)
      << b.out;
  const SavedLogProbs batched = read_saved(saved);
  for (const char* ex : {"mega", "opbyop", "reference"}) {
    SCOPED_TRACE(ex);
    const std::string steps = dir.path + "/steps-" + ex + ".bin";
    const CliRun r =
        run(common + "--no-batched --ubatch 16 --executor " + ex + " --save-logits " + steps + " --kl-base " + saved);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("executor steps (" + std::string(ex) + ", 16 rows)"), std::string::npos) << r.out;
    EXPECT_EQ(number_after(r.out, "same top-1           = "), 100.0) << r.out;
    const SavedLogProbs s = read_saved(steps);
    EXPECT_EQ(s.tokens, batched.tokens);
    ASSERT_EQ(s.logp.size(), batched.logp.size());
    if (std::string(ex) == "reference") {
      EXPECT_LT(number_after(r.out, "KL divergence max    = "), 1e-6) << r.out;
    } else {
      EXPECT_EQ(number_after(r.out, "KL divergence max    = "), 0.0) << r.out;
      EXPECT_EQ(std::memcmp(s.logp.data(), batched.logp.data(), s.logp.size() * sizeof(float)), 0);
    }
  }
}

// The KL report recomputed here from the two saved files, with arithmetic of
// our own (two-pass variances, quantiles by the usual linear interpolation
// between order statistics, first-maximum argmax), against every printed
// figure: a base in the exact mode and a fast-mode run, so the KL values are
// spread and nonzero. The report prints 6 significant digits.
TEST(Perplexity, KlReportMatchesAnIndependentRecomputation) {
  TempDir dir;
  const std::string base_path = dir.path + "/exact.bin", this_path = dir.path + "/fast.bin";
  const std::string common = "perplexity -m dense-mini -f " + gpl_text() + " -c 64 --chunks 3 -t 2 ";
  ASSERT_EQ(run(common + "--save-logits " + base_path).status, 0);
  const CliRun r = run(common + "--numerics fast --save-logits " + this_path + " --kl-base " + base_path);
  ASSERT_EQ(r.status, 0) << r.out;
  const SavedLogProbs b = read_saved(base_path), t = read_saved(this_path);
  ASSERT_EQ(b.tokens, t.tokens);
  ASSERT_EQ(b.logp.size(), t.logp.size());
  const size_t V = b.n_vocab;
  std::vector<double> kl, nll_b, nll_t, dl;
  size_t same = 0;
  for (uint32_t c = 0; c < b.n_chunks; ++c)
    for (uint32_t i = 0; i < b.n_scored; ++i) {
      const float* pb = &b.logp[(size_t{c} * b.n_scored + i) * V];
      const float* pt = &t.logp[(size_t{c} * t.n_scored + i) * V];
      // KL(base || this) as the sum over tokens of p_base (ln p_base - ln p_this).
      double k = 0;
      size_t ab = 0, at = 0;
      for (size_t v = 0; v < V; ++v) {
        k += std::exp((double)pb[v]) * ((double)pb[v] - (double)pt[v]);
        if (pb[v] > pb[ab]) ab = v;
        if (pt[v] > pt[at]) at = v;
      }
      kl.push_back(k);
      const int32_t next = b.tokens[size_t{c} * b.n_ctx + b.n_ctx / 2 + i + 1];
      nll_b.push_back(-(double)pb[next]);
      nll_t.push_back(-(double)pt[next]);
      dl.push_back(nll_t.back() - nll_b.back());
      same += ab == at;
    }
  const size_t n = kl.size();
  ASSERT_EQ(n, 3u * 31u);
  auto mean = [](const std::vector<double>& x) {
    double s = 0;
    for (double v : x) s += v;
    return s / (double)x.size();
  };
  // Standard error of the mean: sample standard deviation / sqrt(n).
  auto sem = [&](const std::vector<double>& x) {
    const double m = mean(x);
    double ss = 0;
    for (double v : x) ss += (v - m) * (v - m);
    return std::sqrt(ss / (double)(x.size() - 1) / (double)x.size());
  };
  auto quantile = [](std::vector<double> x, double q) {
    std::sort(x.begin(), x.end());
    const double h = (double)(x.size() - 1) * q;
    const size_t lo = (size_t)std::floor(h), hi = std::min(lo + 1, x.size() - 1);
    return x[lo] + (h - (double)lo) * (x[hi] - x[lo]);
  };
  auto near = [&](const char* key, double want) {
    const double got = number_after(r.out, key);
    EXPECT_NEAR(got, want, 1e-5 * std::fabs(want) + 1e-12) << key << "\n" << r.out;
  };
  auto near_after = [&](const char* key, const char* sep, double want) {
    const size_t p = r.out.find(key);
    ASSERT_NE(p, std::string::npos) << key;
    const size_t q = r.out.find(sep, p);
    ASSERT_NE(q, std::string::npos) << key << " " << sep;
    const double got = std::strtod(r.out.c_str() + q + std::strlen(sep), nullptr);
    EXPECT_NEAR(got, want, 1e-5 * std::fabs(want) + 1e-12) << key << sep << "\n" << r.out;
  };
  EXPECT_GT(quantile(kl, 0.5), 0.0);  // the two modes differ at every position
  near("KL divergence mean   = ", mean(kl));
  near_after("KL divergence mean   = ", "+/- ", sem(kl));
  near("KL divergence median = ", quantile(kl, 0.5));
  near("KL divergence p99    = ", quantile(kl, 0.99));
  near("KL divergence max    = ", *std::max_element(kl.begin(), kl.end()));
  near("Final estimate: PPL = ", std::exp(mean(nll_t)));
  near_after("Final estimate: PPL = ", "+/- ", sem(nll_t) * std::exp(mean(nll_t)));
  near("PPL(base)            = ", std::exp(mean(nll_b)));
  near_after("PPL(base)            = ", "+/- ", sem(nll_b) * std::exp(mean(nll_b)));
  near("PPL(this)/PPL(base)  = ", std::exp(mean(dl)));
  near("(mean ln ratio ", mean(dl));
  near_after("(mean ln ratio ", "+/- ", sem(dl));
  // Percentages are printed with three decimals.
  const double p = (double)same / (double)n;
  EXPECT_NEAR(number_after(r.out, "same top-1           = "), 100 * p, 6e-4) << r.out;
  const size_t at = r.out.find("same top-1           = ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_NEAR(std::strtod(r.out.c_str() + r.out.find("+/- ", at) + 4, nullptr),
              100 * std::sqrt(p * (1 - p) / (double)(n - 1)), 6e-4)
      << r.out;
  EXPECT_NE(r.out.find("(" + std::to_string(same) + " of " + std::to_string(n) + ")"), std::string::npos) << r.out;
}

// A tokenizer that adds BOS (Gemma 3's): every chunk starts from BOS in place
// of its first text token, and BOS appears nowhere else.
TEST(Perplexity, ChunksStartWithBosWhenTheTokenizerAddsIt) {
  const std::string model = test_model_path("gemma3-270m");
  if (model.empty()) GTEST_SKIP() << "models/gemma3-270m.gguf not fetched";
  TempDir dir;
  const std::string saved = dir.path + "/gemma.bin";
  const CliRun r = run("perplexity -m " + model + " -f " + gpl_text() + " -c 32 --chunks 2 -t 2 --save-logits " + saved);
  ASSERT_EQ(r.status, 0) << r.out;
  const SavedLogProbs s = read_saved(saved);
  ASSERT_EQ(s.n_chunks, 2u);
  // Gemma 3's BOS is token 2 (<bos>); the text's own first token is not.
  EXPECT_EQ(s.tokens[0], 2);
  EXPECT_EQ(s.tokens[32], 2);
  for (size_t i = 1; i < s.tokens.size(); ++i)
    if (i != 32) EXPECT_NE(s.tokens[i], 2) << "BOS inside a chunk at " << i;
  // The reported PPL is that of the saved rows at the tokens after BOS.
  double nll = 0;
  for (uint32_t c = 0; c < s.n_chunks; ++c)
    for (uint32_t i = 0; i < s.n_scored; ++i)
      nll -= s.logp[(size_t{c} * s.n_scored + i) * s.n_vocab + (size_t)s.tokens[c * 32 + 16 + i + 1]];
  EXPECT_NEAR(number_after(r.out, "PPL = "), std::exp(nll / (double)(s.n_chunks * s.n_scored)),
              1e-5 * number_after(r.out, "PPL = "));
}

// A recurrent model's steps are its prompt block (32 rows): the unscored
// half of a 64-token chunk is one whole block, run without the head.
TEST(Perplexity, RunsRecurrentModelsInTheirPromptBlock) {
  const CliRun r = run("perplexity -m qwen3.8-mini -f " + gpl_text() + " -c 64 --chunks 1 -t 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("executor steps (mega, 32 rows; unscored"), std::string::npos) << r.out;
  const double ppl = number_after(r.out, "PPL = ");
  EXPECT_TRUE(std::isfinite(ppl) && ppl > 1) << r.out;
}

TEST(Perplexity, MismatchingOrDamagedBaseFilesAreRefused) {
  TempDir dir;
  const std::string saved = dir.path + "/base.bin";
  const std::string text = gpl_text();
  ASSERT_EQ(run("perplexity -m dense-mini -f " + text + " -c 64 --chunks 2 -t 2 --save-logits " + saved).status, 0);

  CliRun r = run("perplexity -m dense-mini -f " + text + " -c 32 --chunks 2 --kl-base " + saved);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("2 chunks of 64 tokens, this run has 2 chunks of 32"), std::string::npos) << r.out;
  r = run("perplexity -m dense-mini -f " + text + " -c 64 --chunks 3 --kl-base " + saved);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("use the same -c and --chunks"), std::string::npos) << r.out;

  // Same chunking, another text.
  const std::string other = dir.path + "/other.txt";
  {
    std::ofstream o(other);
    for (int i = 0; i < 40; ++i) o << "Another text, entirely unlike a licence. ";
  }
  r = run("perplexity -m dense-mini -f " + other + " -c 64 --chunks 2 --kl-base " + saved);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("a different text or tokenizer"), std::string::npos) << r.out;

  // Another vocabulary: the file's header says 512 tokens.
  {
    std::fstream f(saved, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    const uint32_t v = 1000;
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  r = run("perplexity -m dense-mini -f " + text + " -c 64 --chunks 2 --kl-base " + saved);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("describes"), std::string::npos) << r.out;  // the size no longer matches the header

  ASSERT_EQ(run("perplexity -m dense-mini -f " + text + " -c 64 --chunks 2 -t 2 --save-logits " + saved).status, 0);
  std::filesystem::resize_file(saved, std::filesystem::file_size(saved) - 4);
  r = run("perplexity -m dense-mini -f " + text + " -c 64 --chunks 2 --kl-base " + saved);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("truncated"), std::string::npos) << r.out;

  r = run("perplexity -m dense-mini -f " + text + " -c 64 --chunks 2 --kl-base " + text);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("not a megakern log-probability file"), std::string::npos) << r.out;

  r = run("perplexity -m dense-mini -f " + dir.path + "/missing.txt");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("cannot read text file"), std::string::npos) << r.out;
  r = run("perplexity -m dense-mini -f " + text + " -c 100000");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("fewer than one chunk"), std::string::npos) << r.out;
}

TEST(Perplexity, VocabularyMismatchIsRefused) {
  // qwen3.8-mini and dense-mini differ in vocabulary size.
  TempDir dir;
  const std::string saved = dir.path + "/base.bin";
  const std::string text = gpl_text();
  ASSERT_EQ(run("perplexity -m qwen3.8-mini -f " + text + " -c 32 --chunks 1 -t 2 --save-logits " + saved).status, 0);
  const CliRun r = run("perplexity -m dense-mini -f " + text + " -c 32 --chunks 1 --kl-base " + saved);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("vocabulary of"), std::string::npos) << r.out;
}

TEST(Perplexity, GgufWeightsDequantisedToF32AreTheBaseOfExact) {
  const std::string model = test_model_path("smollm2-135m");
  if (model.empty()) GTEST_SKIP() << "models/smollm2-135m.gguf not fetched";
  TempDir dir;
  const std::string saved = dir.path + "/f32.bin";
  const std::string common = "perplexity -m " + model + " -f " + gpl_text() + " -c 128 --chunks 1 -t 2 ";
  CliRun r = run(common + "--weights f32 --save-logits " + saved);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(", f32 ("), std::string::npos) << r.out;  // the description names the weight format
  r = run(common + "--kl-base " + saved);
  ASSERT_EQ(r.status, 0) << r.out;
  // The exact mode computes the f32 result of the same weights to ~1e-5
  // relative, so the distributions agree to KL ~1e-7 (measured: mean
  // 1.2e-7, max 1.0e-6 over these 63 positions; bounds at about 8-10x).
  const double kl = number_after(r.out, "KL divergence mean   = ");
  EXPECT_GT(kl, 0.0) << r.out;  // Q4_1 kernels are not the f32 computation bit for bit
  EXPECT_LT(kl, 1e-6) << r.out;
  EXPECT_LT(number_after(r.out, "KL divergence max    = "), 1e-5) << r.out;
  EXPECT_EQ(number_after(r.out, "same top-1           = "), 100.0) << r.out;

  r = run(common + "--weights q8_0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--weights can only be f32"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace megakern
