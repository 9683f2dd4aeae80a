// Subcommands of the `megakern` command. Each registers its flags and a
// callback; the callback reports errors on stderr and sets the exit code.
#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace megakern::cli {

void register_run(CLI::App& app);
void register_chat(CLI::App& app);
void register_inspect(CLI::App& app);
void register_bench(CLI::App& app);
void register_gen_model(CLI::App& app);
void register_bench_spec(CLI::App& app);

// The exit status left by the subcommand that ran.
int exit_code();

// Runs a subcommand's body: on success the exit status is 0; an exception is
// reported on stderr as "error: ..." (after flushing stdout) and gives 1.
void run_guarded(const std::function<void()>& body);

}  // namespace megakern::cli
