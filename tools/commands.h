// Subcommands of the `megakern` command. Each registers its flags and a
// callback; the callback reports errors on stderr and sets the exit code.
#pragma once

namespace CLI {
class App;
}

namespace megakern::cli {

void register_run(CLI::App& app);
void register_chat(CLI::App& app);
void register_inspect(CLI::App& app);
void register_bench(CLI::App& app);

// The exit status left by the subcommand that ran.
int exit_code();
void set_exit_code(int rc);

}  // namespace megakern::cli
