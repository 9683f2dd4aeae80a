// The `megakern` command end to end: help, bad flags, missing models, and a
// real generation when the models have been fetched.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace megakern {
namespace {

struct Result {
  int status = -1;
  std::string out;  // stdout and stderr together
};

// stdout followed by stderr.
Result run(const std::string& args) {
  const CliResult c = run_cli(args);
  return {c.status, c.out + c.err};
}

TEST(Cli, HelpForEachCommand) {
  for (const char* c : {"--help", "run --help", "chat --help", "inspect --help", "bench --help", "gen-model --help",
                        "serve --help", "bench-serve --help"}) {
    const Result r = run(c);
    EXPECT_EQ(r.status, 0) << c << ": " << r.out;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << c;
  }
}

TEST(Cli, BadInputGivesClearMessageAndNonZeroExit) {
  Result r = run("");
  EXPECT_NE(r.status, 0);
  r = run("frobnicate");
  EXPECT_NE(r.status, 0);
  r = run("run -p hi --no-such-flag");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("no-such-flag"), std::string::npos) << r.out;
  r = run("run -p hi -m /nonexistent/model.gguf");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("model '/nonexistent/model.gguf' not found"), std::string::npos) << r.out;
  r = run("run -p hi -m no-such-model-name");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("known: smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b"), std::string::npos) << r.out;
  r = run("run -p hi -n -5");
  EXPECT_NE(r.status, 0);
  r = run("run -p hi -n banana");
  EXPECT_NE(r.status, 0);
  r = run("inspect " + std::string(MEGAKERN_SOURCE_DIR) + "/CMakeLists.txt");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("error:"), std::string::npos) << r.out;
}

TEST(Cli, BadSamplingParametersAreRefused) {
  Result r = run("run -p hi --temp -1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--temp: must be a finite number in [0, 1e6], got -1"), std::string::npos) << r.out;
  r = run("run -p hi --top-p 0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--top-p: must be in (0, 1], got 0"), std::string::npos) << r.out;
}

// Numeric flags out of range and empty names are refused when the command
// line is parsed: the model named does not exist, so a message about it
// would mean the flag was not checked first.
TEST(Cli, NumericAndEmptyFlagsAreRefusedBeforeTheModelLoads) {
  const std::string seed_range = "must be decimal digits only, from 0 to 18446744073709551615";
  const std::string m = " -m /nonexistent/model.gguf";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"run -p hi" + m + " --seed 18446744073709551616", "--seed: the seed '18446744073709551616' " + seed_range},
      {"run -p hi" + m + " --seed 1180591620717411303424", "--seed: the seed '1180591620717411303424' " + seed_range},
      {"run -p hi" + m + " --seed -1", "--seed: the seed '-1' " + seed_range},
      {"run -p hi" + m + " --seed 1e3", "--seed: the seed '1e3' " + seed_range},
      {"run -p hi" + m + " --seed 0x10", "--seed: the seed '0x10' " + seed_range},
      {"run -p hi" + m + " --seed ' 5'", "--seed: the seed ' 5' " + seed_range},
      {"run -p hi" + m + " --model-seed 99999999999999999999", "--model-seed: the seed '99999999999999999999' " + seed_range},
      {"chat" + m + " --seed -3", "--seed: the seed '-3' " + seed_range},
      {"gen-model --config dense-mini -o /nonexistent/dir --seed 2.5", "--seed: the seed '2.5' " + seed_range},
      {"gen-drafter --out /nonexistent/dir --seed abc", "--seed: the seed 'abc' " + seed_range},
      {"run -p hi" + m + " --top-k -1", "--top-k: Value -1 not in range 0 to 16777216"},
      {"run -p hi" + m + " --top-p 1.5", "--top-p: must be in (0, 1], got 1.5"},
      {"run -p hi" + m + " --top-p nan", "--top-p: must be in (0, 1], got nan"},
      {"run -p hi" + m + " --temp inf", "--temp: must be a finite number in [0, 1e6], got inf"},
      {"run -p hi" + m + " --temp nan", "--temp: must be a finite number in [0, 1e6], got nan"},
      {"run -p hi" + m + " -n 0", "--n-predict: Value 0 not in range 1 to 1048576"},
      {"run -p hi" + m + " -c 8", "--context: Value 8 not in range 16 to 1048576"},
      {"run -p hi" + m + " -t 5000", "--threads: Value 5000 not in range 0 to 1024"},
      {"perplexity" + m + " --ctx 2", "--ctx: Value 2 not in range 4 to 1048576"},
      {"serve" + m + " --max-tokens 0", "--max-tokens: Value 0 not in range 1 to 1048576"},
      {"serve" + m + " -t -1", "--threads: Value -1 not in range 0 to 1024"},
      {"run -p hi -m ''", "--model: the value is empty"},
      {"serve -m ''", "--model: the value is empty"},
      {"serve" + m + " --host ''", "--host: the value is empty"},
      {"serve" + m + " --model-id ''", "--model-id: the value is empty"},
      {"serve" + m + " --model-id '  '", "--model-id: the value is empty"},
  };
  for (const auto& [args, want] : cases) {
    const Result r = run(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.out.find(want), std::string::npos) << args << ":\n" << r.out;
    EXPECT_EQ(r.out.find("not found"), std::string::npos) << args << ": the model was looked up:\n" << r.out;
  }
  // The largest seed is accepted (the run then fails on the missing model).
  const Result r = run("run -p hi" + m + " --seed 18446744073709551615");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("model '/nonexistent/model.gguf' not found"), std::string::npos) << r.out;
}

TEST(Cli, SmolLM2AnswersTheCapitalOfFrance) {
  if (test_model_path("smollm2-135m").empty()) GTEST_SKIP() << "models/smollm2-135m.gguf not fetched";
  const Result r = run("run -p \"What is the capital of France?\" -n 24");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tok/s"), std::string::npos) << r.out;
}

TEST(Cli, SyntheticPresetsGenerateUnderEveryExecutor) {
  for (const char* model : {"qwen3.8-mini", "kimi-k3-mini", "muse-spark-mini"}) {
    std::string first;
    for (const char* ex : {"mega", "opbyop", "reference"}) {
      const Result r = run(std::string("run -m ") + model + " -p Hello -n 12 --executor " + ex);
      ASSERT_EQ(r.status, 0) << model << " " << ex << ": " << r.out;
      EXPECT_NE(r.out.find("decode: 12 tokens"), std::string::npos) << r.out;
      const std::string text = r.out.substr(0, r.out.find("\n[model"));
      if (first.empty()) first = text;
      EXPECT_EQ(text, first) << model << " " << ex;  // greedy: the same bytes whatever the executor
    }
  }
}

// Greedy speculation gives the plain output on the MoE and KDA architectures
// too (the spec tests cover the dense and DeltaNet models in depth).
TEST(Cli, SpeculationIsLosslessOnEveryArchitecture) {
  for (const char* model : {"kimi-k3-mini", "muse-spark-mini"}) {
    const std::string base = std::string("run -m ") + model + " --raw -p abcabcabcabcabcabcabc -n 40 -q";
    const Result plain = run(base);
    ASSERT_EQ(plain.status, 0) << plain.out;
    for (const char* spec : {"ngram", "self"}) {
      const Result r = run(base + " --spec " + spec);
      ASSERT_EQ(r.status, 0) << model << " " << spec << ": " << r.out;
      EXPECT_EQ(r.out.substr(0, plain.out.size()), plain.out) << model << " " << spec;
    }
  }
}

TEST(Cli, GenModelWritesALoadableCheckpoint) {
  char tmpl[] = "/tmp/megakern-cli-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  Result r = run("gen-model --config qwen3.8-mini -o " + dir + "/m");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/m/config.json"));
  r = run("gen-model --config qwen3.8-mini -o " + dir + "/m");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
  const Result a = run("run -m " + dir + "/m -p Hi -n 6 -q --raw");
  const Result b = run("run -m qwen3.8-mini -p Hi -n 6 -q --raw");
  ASSERT_EQ(a.status, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  r = run("gen-model --config qwen3.8-27b -o " + dir + "/big");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("too large"), std::string::npos) << r.out;
  r = run("gen-model --config nope -o " + dir + "/x");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("unknown preset 'nope'"), std::string::npos) << r.out;
  r = run("gen-model --config muse-spark-mini --experts nvfp4 -o " + dir + "/muse");
  ASSERT_EQ(r.status, 0) << r.out;
  const Result c = run("run -m " + dir + "/muse -p Hi -n 6 -q --raw");
  const Result d = run("run -m muse-spark-mini --experts nvfp4 -p Hi -n 6 -q --raw");
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(c.out, d.out);
  r = run("gen-model --config kimi-k3-mini --experts fp8_e4m3 -o " + dir + "/kimi");
  ASSERT_EQ(r.status, 0) << r.out;
  const Result e = run("run -m " + dir + "/kimi -p Hi -n 6 -q --raw");
  const Result f = run("run -m kimi-k3-mini --experts fp8_e4m3 -p Hi -n 6 -q --raw");
  ASSERT_EQ(e.status, 0) << e.out;
  EXPECT_EQ(e.out, f.out);
  r = run("gen-model --config muse-spark-1.2 -o " + dir + "/big");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("too large"), std::string::npos) << r.out;
  r = run("run -m qwen3.8-mini -p Hi --weights q9_9");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("unknown weight format 'q9_9'"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

TEST(Cli, Gemma3Generates) {
  if (test_model_path("gemma3-270m").empty()) GTEST_SKIP() << "models/gemma3-270m.gguf not fetched";
  // gemma3-270m is a base model with no chat template: the prompt is continued.
  const Result r = run("run -m gemma3-270m -p \"The Eiffel Tower is located in the city of\" -n 8");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("plain text"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << r.out;
}

TEST(Cli, ChatKeepsHistoryAcrossTurns) {
  if (test_model_path("smollm2-135m").empty()) GTEST_SKIP() << "models/smollm2-135m.gguf not fetched";
  const TempDir tmp;
  const std::string input = tmp.path + "/chat_input.txt";
  {
    std::ofstream f(input);
    f << "Hello!\nWhat is 2+2?\n/exit\n";
  }
  const Result r = run("chat --temp 0 -n 12 < " + input);
  ASSERT_EQ(r.status, 0) << r.out;
  // Two answers, the second computed on top of the cached first turn: the
  // statistics line "[N prompt tokens (M new) ... | G tokens at ...]" of turn
  // one computes all N1 tokens; turn two reuses at least the whole first
  // prompt and at most the first prompt plus its answer.
  std::vector<std::array<int, 3>> turns;  // N, M, G
  const std::regex line(R"(\[(\d+) prompt tokens \((\d+) new\) [^|]*\| (\d+) tokens at)");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), line), end; it != end; ++it)
    turns.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), std::stoi((*it)[3])});
  ASSERT_EQ(turns.size(), 2u) << r.out;
  EXPECT_EQ(turns[0][1], turns[0][0]) << r.out;
  const int reused = turns[1][0] - turns[1][1];
  EXPECT_GE(reused, turns[0][0]) << r.out;
  EXPECT_LE(reused, turns[0][0] + turns[0][2]) << r.out;
  EXPECT_GT(turns[1][1], 0) << r.out;
}

TEST(Cli, InspectShowsMetadataAndTensors) {
  if (test_model_path("smollm2-135m").empty()) GTEST_SKIP() << "models/smollm2-135m.gguf not fetched";
  const Result r = run("inspect smollm2-135m");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("general.architecture = \"llama\""), std::string::npos);
  EXPECT_NE(r.out.find("token_embd.weight"), std::string::npos);
  EXPECT_NE(r.out.find("q4_1"), std::string::npos);
}

TEST(Cli, BenchRunsBothExecutorsAndWritesJson) {
  const TempDir tmp;
  const std::string json = tmp.path + "/bench.json";
  const Result r = run("bench -m dense-mini --batch 1,2 --steps 2 --warmup 1 --rounds 1 --probe-mib 64 --json " + json);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("read bandwidth probe"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("opbyop"), std::string::npos);
  EXPECT_NE(r.out.find("mega"), std::string::npos);
  std::ifstream in(json);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json j = nlohmann::json::parse(text);
  // Weights read per step, from dense-mini's shape (src/model/presets.cpp: 4
  // qwen3 layers, hidden 256, MLP 512, 4 query / 2 KV heads of 64, vocabulary
  // 512, Q4_0 = 18 bytes per 32 weights): per layer q 256x256, k and v
  // 256x128, o 256x256, gate and up 256x512, down 512x256; plus the 512x256
  // output matrix; and the f32 norm vectors: per layer attention and MLP
  // norms (256 each) and the q and k head norms (64 each), and the output norm.
  const double q4_0 = 18.0 / 32.0;
  const double per_layer = 256.0 * 256 + 2 * 256.0 * 128 + 256.0 * 256 + 3 * 256.0 * 512;
  const double norms = (4 * (2 * 256.0 + 2 * 64) + 256) * 4;
  const double weights = (4 * per_layer + 512.0 * 256) * q4_0 + norms;
  EXPECT_DOUBLE_EQ(j.at("weight_bytes_per_step").get<double>(), weights);
  // Each row moves its KV cache: per layer the new K and V (2 x 128 floats)
  // and K and V of every position up to the mean timed one (warmup 1 + steps
  // 2 / 2 = position 2, i.e. 3 positions): 4 x 2 x 128 x 4 x (1 + 3) bytes.
  const double state_per_row = 4.0 * 2 * 128 * 4 * (1 + 3);
  const double probe = j.at("probe_gbs").get<double>();
  EXPECT_GT(probe, 0.05);
  EXPECT_LT(probe, 1e4);
  ASSERT_EQ(j.at("results").size(), 4u);
  for (const auto& r : j.at("results")) {
    SCOPED_TRACE(r.dump());
    const int b = r.at("batch").get<int>();
    EXPECT_TRUE(b == 1 || b == 2);
    const double ms = r.at("ms_per_step").get<double>();
    EXPECT_GT(ms, 0);
    EXPECT_LT(ms, 1e4);
    EXPECT_NEAR(r.at("tokens_per_s").get<double>(), b * 1000.0 / ms, 1e-9 * b * 1000.0 / ms);
    EXPECT_DOUBLE_EQ(r.at("bytes_per_step").get<double>(), weights + b * state_per_row);
    EXPECT_NEAR(r.at("gbs").get<double>(), r.at("bytes_per_step").get<double>() / 1e6 / ms, 1e-9 * r.at("gbs").get<double>());
    EXPECT_NEAR(r.at("fraction_of_probe").get<double>(), r.at("gbs").get<double>() / probe, 1e-12);
  }
  for (const char* e : {"opbyop", "mega"}) EXPECT_GE(j.at("schedule_build_ms").at(e).get<double>(), 0) << e;
}

TEST(Cli, BenchRejectsBadLists) {
  Result r = run("bench -m dense-mini --batch 1,x");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("'x' is not a number"), std::string::npos) << r.out;
  r = run("bench -m dense-mini --batch 0");
  EXPECT_EQ(r.status, 1);
  r = run("bench -m dense-mini --executor warp");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("unknown executor 'warp'"), std::string::npos) << r.out;
}

TEST(Cli, InspectProgramListsOpsPerLayer) {
  const Result r = run("inspect --program dense-mini");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("layer 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("weights read per step"), std::string::npos) << r.out;
}

TEST(Cli, InspectScheduleBuildsTheFullKimiProgramFromShapes) {
  Result r = run("inspect --config kimi-k3 --schedule");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("93 layers, 2720 ops"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("batch 8:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all batch sizes:"), std::string::npos) << r.out;
  r = run("inspect --config qwen3.8-27b --schedule");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("Kimi K3 presets"), std::string::npos) << r.out;
  r = run("inspect --schedule");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--schedule needs --config"), std::string::npos) << r.out;
}

TEST(Cli, BenchRunsThePrefetchAblationsOnAMoeModel) {
  const TempDir tmp;
  const std::string json = tmp.path + "/bench_moe.json";
  const Result r = run("bench -m kimi-k3-mini --executor opbyop,mega,mega-noexp,mega-nopf --batch 1,2 --steps 1 "
                       "--warmup 1 --rounds 1 --probe-mib 64 --json " + json);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("mega-noexp"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mega-nopf"), std::string::npos) << r.out;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  // Every executor at every batch size, each figure consistent with the
  // others: the ablations move the same bytes as the megakernel (prefetching
  // changes when weights are read, not what), a batch of 2 reads at least
  // the weights of a batch of 1 (more experts may be picked) and at most
  // twice them, and the rates follow from the time.
  ASSERT_EQ(j.at("results").size(), 8u);
  std::map<int, double> bytes;
  const double probe = j.at("probe_gbs").get<double>();
  for (const auto& e : j.at("results")) {
    SCOPED_TRACE(e.dump());
    const int b = e.at("batch").get<int>();
    const double ms = e.at("ms_per_step").get<double>(), by = e.at("bytes_per_step").get<double>();
    EXPECT_GT(ms, 0);
    if (!bytes.count(b)) bytes[b] = by;
    EXPECT_EQ(by, bytes[b]) << "executors disagree on the bytes a step moves";
    EXPECT_NEAR(e.at("tokens_per_s").get<double>(), b * 1000.0 / ms, 1e-9 * b * 1000.0 / ms);
    EXPECT_NEAR(e.at("gbs").get<double>(), by / 1e6 / ms, 1e-9 * e.at("gbs").get<double>());
    EXPECT_NEAR(e.at("fraction_of_probe").get<double>(), e.at("gbs").get<double>() / probe, 1e-12);
  }
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_GT(bytes[2], bytes[1]);
  EXPECT_LE(bytes[2], 2 * bytes[1]);
}

}  // namespace
}  // namespace megakern
