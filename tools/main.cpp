// The `megakern` command and its subcommands.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>
#include <string>

#include "kernels/cpu/cpu_features.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"megakern: LLM decoding on the CPU.\nModels: a GGUF path or a fetched model name (smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b)."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  megakern::cli::register_run(app);
  megakern::cli::register_chat(app);
  megakern::cli::register_inspect(app);
  megakern::cli::register_bench(app);
  megakern::cli::register_gen_model(app);
  megakern::cli::register_serve(app);
  megakern::cli::register_bench_serve(app);
  megakern::cli::register_bench_spec(app);
  megakern::cli::register_gen_drafter(app);
  megakern::cli::register_gen_drafter_data(app);
  megakern::cli::register_perplexity(app);
  megakern::cli::register_step(app);
  megakern::cli::register_tp_check(app);
  // The CPU's features (and MEGAKERN_ISA) are read here, before any worker
  // thread needs them, so that a bad MEGAKERN_ISA is reported at once.
  try {
    megakern::cpu_features();
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  // A first word that is neither a flag nor a command: CLI11 would only say
  // that a subcommand is required.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      found = found || sub->get_name() == argv[1];
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (!found) {
      fmt::print(stderr, "error: unknown command '{}' (commands: {}; see megakern --help)\n", argv[1], known);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the problem; add where to look.
    const int rc = app.exit(e);
    if (rc != 0) fmt::print(stderr, "Run 'megakern --help' or 'megakern <command> --help' for usage.\n");
    return rc;
  }
  return megakern::cli::exit_code();
}
