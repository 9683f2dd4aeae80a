// `megakern bench-spec` (also `megakern bench --spec DRAFTER`): speculative
// against plain decoding.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace megakern::cli {

struct SpecBenchOptions {
  std::string model = "smollm2-135m";
  std::string numerics = "exact";
  std::string kv_type = "f32";
  std::string drafters = "ngram";  // comma-separated
  int draft = 6;
  bool fixed = false;
  int n_predict = 128;
  int threads = 0;
  int reps = 1;
  int verify_reps = 20;
  std::string json;
  // JSON lines {"name", "category", "text"} to run instead of the built-in
  // input-grounded prompts; results are then also summed per category.
  std::string prompts;
};
// Adds the options bench-spec takes (other than the model) to cmd.
void add_spec_bench_options(CLI::App* cmd, SpecBenchOptions& o, bool with_spec_flag);
// Plain vs speculative decoding of the same input-grounded prompts in one
// run: tokens/s of each, speedup, acceptance length, identical output, and
// the cost of a verify step of 2, 4, 8 and draft + 1 rows against one row.
void spec_bench_cmd(const SpecBenchOptions& o);

void register_bench_spec(CLI::App& app);
// `megakern gen-drafter`: synthetic block-drafter weights for a target.
void register_gen_drafter(CLI::App& app);

}  // namespace megakern::cli
