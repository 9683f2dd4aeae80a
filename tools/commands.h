// Subcommands of the `megakern` command. Each registers its flags and a
// callback; the callback reports errors on stderr and sets the exit code.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "runtime/model.h"

namespace CLI {
class App;
class Option;
}

namespace megakern::cli {

void register_run(CLI::App& app);
void register_chat(CLI::App& app);
void register_inspect(CLI::App& app);
void register_bench(CLI::App& app);
void register_gen_model(CLI::App& app);
void register_serve(CLI::App& app);
void register_bench_serve(CLI::App& app);
void register_bench_spec(CLI::App& app);
void register_gen_drafter(CLI::App& app);
// `megakern gen-drafter-data`: the target's answers to a prompt file with
// the taps of every position, for training a block drafter.
void register_gen_drafter_data(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_step(CLI::App& app);
void register_tp_check(CLI::App& app);

// Milliseconds since t0 on the steady clock.
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0);
// The non-empty items of a comma-separated list ("1,2,,4" -> 1, 2, 4).
std::vector<std::string> split_list(const std::string& s);

// The exit status left by the subcommand that ran.
int exit_code();

// The -m/--model, --weights and --experts options every model-loading
// command shares, and the ModelOptions they describe.
struct ModelFlags {
  std::string weights, experts;
  std::string numerics = "exact";
  std::string kv_type = "f32";
  uint64_t seed = 1;
  ModelOptions options() const;  // throws megakern::Error on an unknown format name
};
void add_model_flags(CLI::App* cmd, std::string& model, ModelFlags& f);
// The --numerics option alone (exact|fast), for commands without the other
// model flags; parse_numerics turns its value into the mode.
void add_numerics_flag(CLI::App* cmd, std::string& numerics);
Numerics parse_numerics(const std::string& value);
// The --kv-type option alone (f32|f16|bf16|q8_0: the KV cache's element
// type, core/kv_type.h); parse_kv_type refuses other names, listing these.
void add_kv_type_flag(CLI::App* cmd, std::string& kv_type);
KvType parse_kv_type(const std::string& value);

// Checks on a flag's text, applied when the command line is parsed (before
// any model loads); a failure names the flag and the constraint.
// A seed: decimal digits only, at most 2^64 - 1 (no sign, no exponent, no wrap).
CLI::Option* check_seed(CLI::Option* opt);
// A name or address that must not be empty (or only spaces).
CLI::Option* check_non_empty(CLI::Option* opt);
// A file the command writes: its directory must exist and the path must not
// be a directory (checked before any work, so that a long run does not fail
// at its end).
CLI::Option* check_output_file(CLI::Option* opt);
// A finite number from lo (included or not) to hi (infinity: no upper bound).
CLI::Option* check_finite(CLI::Option* opt, double lo, bool lo_included, double hi);
// A comma-separated list of drafters whose kinds make_drafter knows.
CLI::Option* check_drafters(CLI::Option* opt);

// --tp N: tensor parallelism over the N processes of `mpirun -np N`
// (dist/tensor_parallel.h). apply_tensor_parallel makes every program of the
// model this rank's part (nothing for N = 1) and returns the rank; rank 0
// prints, the others follow (their logits are the same bits: the last op
// gathers them, and they sample alike). Throws when N is not the MPI world's
// size or the model's heads or MLP do not split N ways.
void add_tp_flag(CLI::App* cmd, int& tp);
int apply_tensor_parallel(Model& model, int tp);

// Runs a subcommand's body: on success the exit status is 0; an exception is
// reported on stderr as "error: ..." (after flushing stdout) and gives 1.
void run_guarded(const std::function<void()>& body);

}  // namespace megakern::cli
