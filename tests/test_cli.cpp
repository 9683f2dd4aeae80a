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

// A refusal: the exit status and each piece of the message (stdout and
// stderr together), which names the flag or file and the constraint.
struct Refusal {
  std::string args;
  int status;  // 1: the command's own check; 105 / 106: CLI11's ValidationError / RequiredError; 2: no command
  std::vector<std::string> want;
};

void expect_refusals(const std::vector<Refusal>& cases) {
  for (const Refusal& c : cases) {
    const Result r = run(c.args);
    EXPECT_EQ(r.status, c.status) << c.args << ":\n" << r.out;
    for (const std::string& w : c.want) EXPECT_NE(r.out.find(w), std::string::npos) << c.args << ": no '" << w << "' in:\n" << r.out;
  }
}

TEST(Cli, BadInputGivesClearMessageAndNonZeroExit) {
  const std::string known = "known: smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b";
  expect_refusals({
      {"", 106, {"A subcommand is required"}},
      {"frobnicate", 2, {"unknown command 'frobnicate'", "commands: run, chat, inspect"}},
      {"run -p hi --no-such-flag", 109, {"The following argument was not expected: --no-such-flag"}},
      {"run -p hi -m /nonexistent/model.gguf", 1, {"model '/nonexistent/model.gguf' not found", known}},
      {"run -p hi -m no-such-model-name", 1, {"model 'no-such-model-name' not found", known}},
      {"run -p hi -n -5", 105, {"--n-predict: Value -5 not in range 1 to 1048576"}},
      {"run -p hi -n banana", 105, {"--n-predict: Value banana not in range 1 to 1048576"}},
      {"inspect " + std::string(MEGAKERN_SOURCE_DIR) + "/CMakeLists.txt", 1,
       {"error: " + std::string(MEGAKERN_SOURCE_DIR) + "/CMakeLists.txt: not a model file"}},
  });
}

// Every command's flags out of range, bad names of a mode, an executor or a
// format, missing and unwritable files: refused with the exit status and a
// message that names the flag or file and what it must be. Where the model
// named does not exist, the flag is checked before the model loads.
TEST(Cli, EveryCommandNamesTheFlagAndTheConstraintItRefuses) {
  const TempDir tmp;
  const std::string none = "/nonexistent/model.gguf", m = " -m " + none;
  const std::string missing_dir = tmp.path + "/no-such-dir";
  const std::string drafters = "(expected ngram, ngram:N, self, self:N, self:skip=A-B, model:PATH, dspark[:PATH] or dflash[:PATH])";
  const std::string unwritable = "cannot write '" + missing_dir + "/out': the directory '" + missing_dir + "' does not exist";
  expect_refusals({
      // run / chat
      {"run -m dense-mini", 106, {"--prompt is required"}},
      {"run -p hi" + m + " --executor warp", 105, {"--executor: warp not in {mega,opbyop,reference}"}},
      {"run -p hi" + m + " --ubatch 0", 105, {"--ubatch: Value 0 not in range 1 to 256"}},
      {"run -p hi" + m + " --ubatch 100000", 105, {"--ubatch: Value 100000 not in range 1 to 256"}},
      {"run -p hi" + m + " --draft 40", 105, {"--draft: Value 40 not in range 1 to 32"}},
      {"run -p hi" + m + " --tp 0", 105, {"--tp: Value 0 not in range 1 to 1024"}},
      {"run -p hi" + m + " --top-k 99999999999", 105, {"--top-k: Value 99999999999 not in range 0 to 16777216"}},
      {"run -p hi" + m + " -c 99999999999", 105, {"--context: Value 99999999999 not in range 16 to 1048576"}},
      {"run -p hi" + m + " --spec nonsense", 105, {"--spec: unknown drafter 'nonsense' " + drafters}},
      {"run -p hi -m dense-mini --numerics medium", 1, {"--numerics: unknown mode 'medium' (exact or fast)"}},
      {"run -p hi -m dense-mini --weights q9_9", 1, {"--weights: unknown weight format 'q9_9'"}},
      {"run -p hi -m dense-mini --experts q9_9", 1, {"--experts: unknown weight format 'q9_9'"}},
      {"run -p hi -m dense-mini --chat-template " + tmp.path + "/t.jinja", 1,
       {"--chat-template '" + tmp.path + "/t.jinja' is neither a built-in format", "nor a readable template file"}},
      {"chat" + m + " -n 0", 105, {"--n-predict: Value 0 not in range 1 to 1048576"}},
      {"chat" + m, 1, {"model '" + none + "' not found"}},
      // inspect
      {"inspect " + tmp.path + "/model.gguf", 1, {"model '" + tmp.path + "/model.gguf' not found"}},
      {"inspect --config nope", 1, {"unknown config preset 'nope' (known: dense-bench, dense-mini"}},
      {"inspect" + m + " --max-array -1", 105, {"--max-array: Value -1 not in range 0 to 1073741824"}},
      {"inspect --config kimi-k3 --schedule --max-rows 65", 105, {"--max-rows: Value 65 not in range 1 to 64"}},
      // bench
      {"bench -m dense-mini --batch 0", 1, {"--batch: 0 is outside 1..64"}},
      {"bench -m dense-mini --batch 65", 1, {"--batch: 65 is outside 1..64"}},
      {"bench -m dense-mini --batch ,", 1, {"--batch needs at least one batch size"}},
      {"bench -m dense-mini --executor ,", 1, {"--executor needs at least one of opbyop, mega, reference"}},
      {"bench -m dense-mini --numerics fast,slow", 1, {"--numerics: unknown mode 'slow' (exact or fast)"}},
      {"bench" + m + " --steps 0", 105, {"--steps: Value 0 not in range 1 to 100000"}},
      {"bench" + m + " --warmup -1", 105, {"--warmup: Value -1 not in range 0 to 1000"}},
      {"bench" + m + " --rounds 0", 105, {"--rounds: Value 0 not in range 1 to 100"}},
      {"bench" + m + " --probe-mib 1", 105, {"--probe-mib: Value 1 not in range 64 to 16384"}},
      {"bench" + m + " --prefetch-kib -5", 105, {"--prefetch-kib: Value -5 not in range 0 to 1048576"}},
      {"bench" + m + " --prompt -3", 105, {"--prompt: Value -3 not in range 1 to 1048576"}},
      {"bench" + m + " --ubatch 0", 105, {"--ubatch: Value 0 not in range 1 to 512"}},
      {"bench" + m + " --json " + missing_dir + "/out", 105, {"--json: " + unwritable}},
      {"bench" + m + " --trace " + missing_dir + "/out", 105, {"--trace: " + unwritable}},
      {"bench" + m + " --svg " + tmp.path, 105, {"--svg: '" + tmp.path + "' is a directory, not a file"}},
      {"bench" + m + " --spec nonsense", 105, {"--spec: unknown drafter 'nonsense'"}},
      {"bench" + m, 1, {"model '" + none + "' not found"}},
      // gen-model
      {"gen-model --config dense-mini", 106, {"--output is required"}},
      {"gen-model -o " + tmp.path + "/gm", 106, {"--config is required"}},
      {"gen-model --config muse-spark-mini --layout weird -o " + tmp.path + "/gm", 1,
       {"--layout: expected 'ours' or 'reference', got 'weird'"}},
      {"gen-model --config muse-spark-mini --experts q9_9 -o " + tmp.path + "/gm", 1, {"--experts: unknown weight format 'q9_9'"}},
      {"gen-model --config dense-mini --layout reference -o " + tmp.path + "/gm", 1,
       {"--layout reference: written for the Muse Spark presets only so far (got 'dense-mini')"}},
      {"gen-model --config dense-mini -o " + std::string(MEGAKERN_SOURCE_DIR) + "/CMakeLists.txt", 1,
       {"-o " + std::string(MEGAKERN_SOURCE_DIR) + "/CMakeLists.txt: exists and is not a directory"}},
      // serve (refused before it listens: a server that started would not return)
      {"serve" + m + " --port 70000", 105, {"--port: Value 70000 not in range 0 to 65535"}},
      {"serve" + m + " --port -1", 105, {"--port: Value -1 not in range 0 to 65535"}},
      {"serve" + m + " --batch 65", 105, {"--batch: Value 65 not in range 1 to 64"}},
      {"serve" + m + " --queue -1", 105, {"--queue: Value -1 not in range 0 to 100000"}},
      {"serve" + m + " --executor warp", 105, {"--executor: warp not in {mega,opbyop,reference}"}},
      {"serve" + m + " --prefix-cache maybe", 105, {"--prefix-cache: maybe not in {on,off}"}},
      {"serve" + m + " --http-threads 0", 105, {"--http-threads: Value 0 not in range 1 to 256"}},
      {"serve" + m + " --max-connections 0", 105, {"--max-connections: Value 0 not in range 1 to 1000000"}},
      {"serve" + m + " --idle-timeout 0", 105, {"--idle-timeout: Value 0 not in range 0.001"}},
      {"serve" + m + " --drain-timeout -1", 105, {"--drain-timeout: Value -1 not in range 0 to 3600"}},
      {"serve" + m + " -c 8", 105, {"--context: Value 8 not in range 16 to 1048576"}},
      {"serve -m dense-mini --numerics medium", 1, {"--numerics: unknown mode 'medium' (exact or fast)"}},
      {"serve -m dense-mini --port 0 --chat-template " + tmp.path + "/t.jinja", 1,
       {"--chat-template '" + tmp.path + "/t.jinja' is neither a built-in format"}},
      {"serve" + m + " --port 0", 1, {"model '" + none + "' not found"}},
      // bench-serve
      {"bench-serve --concurrency 0", 105, {"--concurrency: Value 0 not in range 1 to 4096"}},
      {"bench-serve --requests 0", 105, {"--requests: Value 0 not in range 1 to 1000000"}},
      {"bench-serve --output-len 0", 105, {"--output-len: Value 0 not in range 1 to 1048576"}},
      {"bench-serve --turns 0", 105, {"--turns: Value 0 not in range 1 to 1000"}},
      {"bench-serve --url notaurl --requests 1", 1, {"--url must start with http:// or https://, got 'notaurl'"}},
      // bench-spec / gen-drafter
      {"bench-spec" + m + " --spec nonsense", 105, {"--spec: unknown drafter 'nonsense' " + drafters}},
      {"bench-spec" + m + " --drafters ngram,bogus:3", 105, {"--spec: unknown drafter 'bogus:3'"}},
      {"bench-spec" + m + " --draft 0", 105, {"--draft: Value 0 not in range 1 to 32"}},
      {"bench-spec" + m + " -n 0", 105, {"--n-predict: Value 0 not in range 1 to 65536"}},
      {"bench-spec" + m + " --reps 0", 105, {"--reps: Value 0 not in range 1 to 100"}},
      {"bench-spec" + m + " --verify-reps 0", 105, {"--verify-reps: Value 0 not in range 1 to 10000"}},
      {"bench-spec" + m + " --json " + missing_dir + "/out", 105, {"--json: " + unwritable}},
      {"bench-spec" + m, 1, {"model '" + none + "' not found"}},
      {"gen-drafter -m dense-mini --kind other -o " + tmp.path + "/gd", 105, {"--kind: other not in {dspark,dflash}"}},
      {"gen-drafter -m dense-mini", 106, {"--out is required"}},
      {"gen-drafter" + m + " -o " + tmp.path + "/gd", 1, {"model '" + none + "' not found"}},
      // perplexity
      {"perplexity -m dense-mini", 106, {"--file is required"}},
      {"perplexity -m dense-mini -f " + tmp.path + "/t.txt", 1, {"-f: cannot read text file '" + tmp.path + "/t.txt'"}},
      {"perplexity -m dense-mini -f /dev/null", 1, {"-f: text file '/dev/null' is empty"}},
      {"perplexity" + m + " -f README.md --chunks -1", 105, {"--chunks: Value -1 not in range 0 to 1048576"}},
      {"perplexity" + m + " -f README.md --executor warp", 105, {"--executor: warp not in {mega,opbyop,reference,serial}"}},
      {"perplexity" + m + " -f README.md --ubatch -1", 105, {"--ubatch: Value -1 not in range 0 to 4096"}},
      {"perplexity" + m + " -f README.md --save-logits " + missing_dir + "/out", 105, {"--save-logits: " + unwritable}},
      {"perplexity -m dense-mini -f " + std::string(MEGAKERN_SOURCE_DIR) + "/README.md --kl-base " + tmp.path + "/b.bin", 1,
       {"--kl-base: cannot read '" + tmp.path + "/b.bin'"}},
      // step
      {"step" + m + " --rows 0", 105, {"--rows: Value 0 not in range 1 to 64"}},
      {"step" + m + " --executor warp", 105, {"--executor: warp not in {serial,reference,mega,opbyop}"}},
      {"step" + m + " -t 0", 105, {"--threads: Value 0 not in range 1 to 256"}},
      {"step" + m + " --stop-after-op -1", 105, {"--stop-after-op: Value -1 not in range 0 to 1073741824"}},
      {"step" + m + " --layers 0", 105, {"--layers: Value 0 not in range 1 to 1048576"}},
      {"step" + m + " --values -1", 105, {"--values: Value -1 not in range 0 to 1048576"}},
      {"step" + m + " --bisect 0", 105, {"--bisect: must be a finite number above 0, got '0'"}},
      {"step" + m + " --bisect nan", 105, {"--bisect: must be a finite number above 0, got 'nan'"}},
      {"step -m dense-mini --slot nope", 1, {"--slot: the program has no slot 'nope'"}},
      {"step -m dense-mini --rows 64 -p ab", 1, {"--rows 64: the prompt has only 2 tokens"}},
      // tp-check
      {"tp-check" + m + " --tp 0", 105, {"--tp: Value 0 not in range 1 to 1024"}},
      {"tp-check" + m + " -n 0", 105, {"--steps: Value 0 not in range 1 to 4096"}},
      {"tp-check" + m + " -t 0", 105, {"--threads: Value 0 not in range 1 to 1024"}},
      {"tp-check" + m + " --executor warp", 105, {"--executor: warp not in {mega,opbyop,serial,reference}"}},
      {"tp-check" + m + " --tol -1", 105, {"--tol: must be a finite number of at least 0 and at most 1, got '-1'"}},
      {"tp-check -m dense-mini --tp 3 --local", 1, {"--tp 3: qwen3 has 4 query heads and 2 key/value heads"}},
      {"tp-check -m dense-mini -p '' --local --tp 2", 1, {"the prompt has no tokens"}},
  });
}

TEST(Cli, BadSamplingParametersAreRefused) {
  Result r = run("run -p hi --temp -1");
  EXPECT_EQ(r.status, 105);
  EXPECT_NE(r.out.find("--temp: must be a finite number in [0, 1e6], got -1"), std::string::npos) << r.out;
  r = run("run -p hi --top-p 0");
  EXPECT_EQ(r.status, 105);
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
    EXPECT_EQ(r.status, 105) << args << ":\n" << r.out;
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
  const TempDir tmp;
  const std::string& dir = tmp.path;
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
  EXPECT_NE(r.out.find("--batch: 0 is outside 1..64"), std::string::npos) << r.out;
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
  // The other full-size presets build from shapes too (shapes-only models).
  r = run("inspect --config qwen3.8-27b --schedule --max-rows 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("shapes only, no weight memory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("batch 2:"), std::string::npos) << r.out;
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
