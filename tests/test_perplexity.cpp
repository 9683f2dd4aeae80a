// `megakern perplexity` end to end: the reported PPL against the saved
// log-probabilities (read here with a reader of our own, from the format
// documented in tools/cmd_perplexity.cpp), the KL report of a run against
// itself, the executor-step path against the batched pass, refusal of
// mismatching base files, and `--weights f32` on a GGUF file.
#include <gtest/gtest.h>

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

TEST(Perplexity, ExecutorStepsAgreeWithTheBatchedPass) {
  TempDir dir;
  const std::string saved = dir.path + "/batched.bin";
  const std::string common = "perplexity -m dense-mini -f " + gpl_text() + " -c 48 --chunks 2 -t 2 ";
  ASSERT_EQ(run(common + "--save-logits " + saved).status, 0);
  const CliRun r = run(common + "--no-batched --ubatch 16 --kl-base " + saved);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("executor steps"), std::string::npos) << r.out;
  EXPECT_LT(number_after(r.out, "KL divergence max    = "), 1e-6) << r.out;
  EXPECT_EQ(number_after(r.out, "same top-1           = "), 100.0) << r.out;
}

TEST(Perplexity, RunsModelsWithoutABatchedPassByExecutorSteps) {
  const CliRun r = run("perplexity -m qwen3.8-mini -f " + gpl_text() + " -c 32 --chunks 1 -t 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("executor steps"), std::string::npos) << r.out;
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
  // The exact mode computes the f32 result of the same weights to ~1e-5.
  const double kl = number_after(r.out, "KL divergence mean   = ");
  EXPECT_GT(kl, 0.0) << r.out;  // Q4_1 kernels are not the f32 computation bit for bit
  EXPECT_LT(kl, 1e-3) << r.out;
  EXPECT_GE(number_after(r.out, "same top-1           = "), 98.0) << r.out;

  r = run(common + "--weights q8_0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--weights can only be f32"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace megakern
