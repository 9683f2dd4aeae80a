// `megakern gen-model`: writes the deterministic synthetic checkpoint of an
// architecture preset (config.json + model.safetensors) to a directory, which
// `megakern run -m DIR` and every other command load like any checkpoint.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "core/error.h"
#include "model/architecture.h"
#include "tools/commands.h"

namespace megakern::cli {
namespace {

struct GenModelOptions {
  std::string config;
  std::string out;
  uint64_t seed = 1;
  bool force = false;
  std::string weights, experts;
  std::string layout = "ours";  // or "reference": the published reference's checkpoint layout
};

// The presets of the architectures that write checkpoints.
std::string preset_list() {
  std::vector<std::string> v;
  for (const Architecture* a : architectures())
    if (!a->hf_model_types().empty())
      for (const std::string& p : a->presets()) v.push_back(p);
  return join_names(v);
}

std::optional<DType> format_flag(const std::string& flag, const std::string& v) {
  if (v.empty()) return std::nullopt;
  const auto t = dtype_from_name(v);
  if (!t) fail("{}: unknown weight format '{}'", flag, v);
  return *t;
}

void gen_model_cmd(const GenModelOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(o.out, ec) && !fs::is_directory(o.out, ec)) fail("-o {}: exists and is not a directory", o.out);
  if (!o.force && fs::exists(fs::path(o.out) / "model.safetensors", ec))
    fail("-o {}: already holds a model.safetensors (pass --force to overwrite)", o.out);
  if (o.layout != "ours" && o.layout != "reference")
    fail("--layout: expected 'ours' or 'reference', got '{}'", o.layout);
  const Architecture* arch = architecture_of_preset(o.config);
  if (!arch || arch->hf_model_types().empty())
    fail("--config: unknown preset '{}' (known: {})", o.config, preset_list());
  if (o.layout == "reference" && !arch->writes_reference_layout())
    fail("--layout reference: written for the Muse Spark presets only so far (got '{}')", o.config);
  GenOptions g;
  g.seed = o.seed;
  g.weights = format_flag("--weights", o.weights);
  g.experts = format_flag("--experts", o.experts);
  g.layout = o.layout;
  const auto t0 = std::chrono::steady_clock::now();
  arch->generate(o.config, g, o.out);
  const double ms = ms_since(t0);
  fmt::print("wrote {} (seed {}) to {}/ in {:.0f} ms: config.json, model.safetensors\n", o.config, o.seed, o.out, ms);
}

}  // namespace

void register_gen_model(CLI::App& app) {
  auto o = std::make_shared<GenModelOptions>();
  auto* cmd = app.add_subcommand(
      "gen-model", "Write a preset's deterministic synthetic weights as a checkpoint directory (config.json + safetensors)");
  cmd->add_option("--config", o->config, "Architecture preset (" + preset_list() + ")")->required();
  cmd->add_option("-o,--output", o->out, "Output directory (created if missing)")->required();
  check_seed(cmd->add_option("--seed", o->seed, "Seed of the weights")->capture_default_str());
  cmd->add_flag("-f,--force", o->force, "Overwrite an existing checkpoint in the directory");
  cmd->add_option("--weights", o->weights, "MoE presets: format of the dense matrices (bf16, int8_col, f32)");
  cmd->add_option("--experts", o->experts, "MoE presets: format of the routed experts (int4_g128, nvfp4, ...)");
  cmd->add_option("--layout", o->layout,
                  "Checkpoint layout: ours, or reference (the published reference's names and config keys; "
                  "Muse Spark presets; block-format matrices are written dequantised)")
      ->capture_default_str();
  cmd->callback([o] { run_guarded([&] { gen_model_cmd(*o); }); });
}

}  // namespace megakern::cli
