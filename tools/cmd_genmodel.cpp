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
#include "model/kimi.h"
#include "model/kimi_config.h"
#include "model/muse.h"
#include "model/muse_config.h"
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
  std::string weights, experts;
  std::string layout = "ours";  // or "reference": the published reference's checkpoint layout
};

std::string preset_list() {
  std::string s;
  for (const auto& c : qwen38_presets()) s += (s.empty() ? "" : ", ") + c.name;
  for (const auto& c : kimi_presets()) s += ", " + c.name;
  for (const auto& c : muse_presets()) s += ", " + c.name;
  return s;
}

DType format_flag(const std::string& flag, const std::string& v, DType dflt) {
  if (v.empty()) return dflt;
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
  const bool reference = o.layout == "reference";
  if (reference && !find_muse_preset(o.config))
    fail("--layout reference: written for the Muse Spark presets only so far (got '{}')", o.config);
  const auto t0 = std::chrono::steady_clock::now();
  if (const Qwen38Config* c = find_qwen38_preset(o.config)) {
    const double gb = static_cast<double>(weight_bytes_total(*c, DType::BF16)) / 1e9;
    if (gb > 8) fail("--config {}: {:.0f} GB of bf16 weights is too large to generate; use a mini or bench preset", o.config, gb);
    if (!o.weights.empty() || !o.experts.empty())
      fail("--config {}: the checkpoint is written in bf16 (convert at load with --weights)", o.config);
    write_qwen38_synthetic(*c, o.seed, o.out);
  } else if (const KimiConfig* k = find_kimi_preset(o.config)) {
    if (k->name == "kimi-k3") fail("--config {}: ~1.5 TB of weights is too large to generate; use a mini or bench preset", o.config);
    KimiWeightOptions ko;
    ko.dense = format_flag("--weights", o.weights, DType::BF16);
    const DType ex = format_flag("--experts", o.experts, DType::MXFP4);
    if (ex != DType::MXFP4 && ex != DType::FP8_E4M3) fail("--experts: Kimi K3 experts are mxfp4 or fp8_e4m3");
    ko.fp8_experts = ex == DType::FP8_E4M3;
    KimiModel::synthetic(*k, o.seed, ko)->save(o.out);
  } else if (const MuseConfig* m = find_muse_preset(o.config)) {
    if (m->name == "muse-spark-1.2")
      fail("--config {}: ~454 GB of weights (bf16 dense, int4 experts) is too large to generate; use a mini or bench preset", o.config);
    const auto model = MuseModel::synthetic(*m, o.seed, format_flag("--weights", o.weights, DType::BF16),
                                            format_flag("--experts", o.experts, DType::INT4_G128));
    if (reference)
      model->save_reference(o.out);
    else
      model->save(o.out);
  } else {
    fail("--config: unknown preset '{}' (known: {})", o.config, preset_list());
  }
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
  cmd->add_option("--seed", o->seed, "Seed of the weights")->capture_default_str();
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
