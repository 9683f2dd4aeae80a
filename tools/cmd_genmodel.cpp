// `megakern gen-model`: writes the deterministic synthetic checkpoint of an
// architecture preset (config.json + model.safetensors) to a directory, which
// `megakern run -m DIR` and every other command load like any checkpoint.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "core/error.h"
#include "model/qwen38.h"
#include "model/qwen38_config.h"
#include "tools/commands.h"

namespace megakern::cli {
namespace {

struct GenModelOptions {
  std::string config;
  std::string out;
  uint64_t seed = 1;
  bool force = false;
};

std::string preset_list() {
  std::string s;
  for (const auto& c : qwen38_presets()) s += (s.empty() ? "" : ", ") + c.name;
  return s;
}

void gen_model_cmd(const GenModelOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(o.out, ec) && !fs::is_directory(o.out, ec)) fail("-o {}: exists and is not a directory", o.out);
  if (!o.force && fs::exists(fs::path(o.out) / "model.safetensors", ec))
    fail("-o {}: already holds a model.safetensors (pass --force to overwrite)", o.out);
  const auto t0 = std::chrono::steady_clock::now();
  if (const Qwen38Config* c = find_qwen38_preset(o.config)) {
    const double gb = static_cast<double>(weight_bytes_total(*c, DType::BF16)) / 1e9;
    if (gb > 8) fail("--config {}: {:.0f} GB of bf16 weights is too large to generate; use a mini or bench preset", o.config, gb);
    write_qwen38_synthetic(*c, o.seed, o.out);
  } else {
    fail("--config: unknown preset '{}' (known: {})", o.config, preset_list());
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("wrote {} (seed {}) to {}/ in {:.0f} ms: config.json, model.safetensors\n", o.config, o.seed, o.out, ms);
}

}  // namespace

void register_gen_model(CLI::App& app) {
  auto o = std::make_shared<GenModelOptions>();
  auto* cmd = app.add_subcommand(
      "gen-model", "Write a preset's deterministic synthetic weights as a checkpoint directory (config.json + safetensors)");
  cmd->add_option("--config", o->config, "Architecture preset (" + preset_list() + ")")->required();
  cmd->add_option("-o,--output", o->out, "Output directory (created if missing)")->required();
  cmd->add_option("--seed", o->seed, "Seed of the weights")->capture_default_str();
  cmd->add_flag("-f,--force", o->force, "Overwrite an existing checkpoint in the directory");
  cmd->callback([o] { run_guarded([&] { gen_model_cmd(*o); }); });
}

}  // namespace megakern::cli
