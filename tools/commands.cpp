#include "tools/commands.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "dist/mpi_comm.h"
#include "dist/tensor_parallel.h"
#include "spec/drafter.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <exception>
#include <sstream>
#include <string_view>

namespace megakern::cli {
namespace {
int g_exit_code = 0;
}  // namespace

int exit_code() { return g_exit_code; }

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

ModelOptions ModelFlags::options() const {
  ModelOptions o;
  o.seed = seed;
  auto parse = [](const std::string& flag, const std::string& v) {
    const auto t = dtype_from_name(v);
    if (!t) fail("{}: unknown weight format '{}' (e.g. f32, bf16, q8_0, q4_0, q4_1, q4_k, q5_k, q3_k, iq4_nl, iq4_xs, mxfp4, int4_g128, nvfp4, int8_col)", flag, v);
    return *t;
  };
  if (!weights.empty()) o.weights = parse("--weights", weights);
  if (!experts.empty()) o.experts = parse("--experts", experts);
  o.numerics = parse_numerics(numerics);
  o.kv_type = parse_kv_type(kv_type);
  return o;
}

KvType parse_kv_type(const std::string& value) {
  const auto t = kv_type_from_name(value);
  if (!t) fail("--kv-type: unknown KV cache type '{}' (the types are {})", value, kv_type_names());
  return *t;
}

void add_kv_type_flag(CLI::App* cmd, std::string& kv_type) {
  cmd->add_option("--kv-type", kv_type,
                  "Element type of the attention KV cache: f32, f16, bf16 (rounded to nearest even) or q8_0 (blocks "
                  "of 32 along a head with an f16 scale); the recurrent state stays f32")
      ->capture_default_str();
}

Numerics parse_numerics(const std::string& value) {
  const auto n = numerics_from_name(value);
  if (!n) fail("--numerics: unknown mode '{}' (exact or fast)", value);
  return *n;
}

void add_numerics_flag(CLI::App* cmd, std::string& numerics) {
  cmd->add_option("--numerics", numerics,
                  "How activations meet quantised weights: exact (int16 activations, the f32 result of the same "
                  "weights to ~1e-5) or fast (int8 activations, llama.cpp-class accuracy)")
      ->capture_default_str();
}

void add_model_flags(CLI::App* cmd, std::string& model, ModelFlags& f) {
  check_non_empty(cmd->add_option("-m,--model", model,
                                   "Model: a GGUF file, a checkpoint directory, a fetched model or a preset (" +
                                       fmt::format("{}", fmt::join(known_model_and_preset_names(), ", ")) + ")")
                       ->capture_default_str());
  cmd->add_option("--weights", f.weights,
                  "Weight format of a checkpoint directory or preset, converted at load (e.g. q8_0, q4_0, bf16; for "
                  "MoE presets the dense matrices: bf16, int8_col; GGUF files and dense presets: f32 only, every "
                  "matrix dequantised at load)");
  cmd->add_option("--experts", f.experts, "MoE presets: format of the routed experts (int4_g128, nvfp4, ...)");
  check_seed(cmd->add_option("--model-seed", f.seed, "Seed of a synthetic preset's weights")->capture_default_str());
  add_numerics_flag(cmd, f.numerics);
  add_kv_type_flag(cmd, f.kv_type);
}

CLI::Option* check_seed(CLI::Option* opt) {
  return opt->check(
      [](const std::string& v) -> std::string {
        const std::string max = "18446744073709551615";  // 2^64 - 1
        const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
        std::string_view d(v);
        while (d.size() > 1 && d.front() == '0') d.remove_prefix(1);
        if (!digits || d.size() > max.size() || (d.size() == max.size() && d > max))
          return fmt::format("the seed '{}' must be decimal digits only, from 0 to {}", v, max);
        return "";
      },
      "SEED");
}

CLI::Option* check_non_empty(CLI::Option* opt) {
  return opt->check(
      [](const std::string& v) -> std::string {
        if (v.find_first_not_of(" \t\r\n") == std::string::npos) return "the value is empty";
        return "";
      },
      "NONEMPTY");
}

CLI::Option* check_output_file(CLI::Option* opt) {
  return opt->check(
      [](const std::string& v) -> std::string {
        namespace fs = std::filesystem;
        if (v.find_first_not_of(" \t\r\n") == std::string::npos) return "the file name is empty";
        std::error_code ec;
        if (fs::is_directory(v, ec)) return fmt::format("'{}' is a directory, not a file", v);
        const fs::path dir = fs::path(v).parent_path();
        if (!dir.empty() && !fs::is_directory(dir, ec))
          return fmt::format("cannot write '{}': the directory '{}' does not exist", v, dir.string());
        return "";
      },
      "FILE");
}

CLI::Option* check_finite(CLI::Option* opt, double lo, bool lo_included, double hi) {
  return opt->check(
      [=](const std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        const bool ok = !v.empty() && end && *end == '\0' && std::isfinite(x) && (lo_included ? x >= lo : x > lo) &&
                        x <= hi;
        if (ok) return "";
        const std::string upper = std::isinf(hi) ? "" : fmt::format(" and at most {:g}", hi);
        return fmt::format("must be a finite number {} {:g}{}, got '{}'", lo_included ? "of at least" : "above", lo,
                           upper, v);
      },
      "NUMBER");
}

CLI::Option* check_drafters(CLI::Option* opt) {
  return opt->check(
      [](const std::string& v) -> std::string {
        const std::vector<std::string> specs = split_list(v);
        if (specs.empty()) return fmt::format("no drafter named (expected {})", kDrafterForms);
        for (const std::string& s : specs)
          if (!known_drafter_kind(s)) return fmt::format("unknown drafter '{}' (expected {})", s, kDrafterForms);
        return "";
      },
      "DRAFTERS");
}

void add_tp_flag(CLI::App* cmd, int& tp) {
  cmd->add_option("--tp", tp, "Tensor parallelism over the N processes of mpirun -np N (1: none)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
}

int apply_tensor_parallel(Model& model, int tp) {
  if (tp == 1) return 0;
  Communicator& world = mpi_world();
  if (world.size() != tp)
    fail("--tp {} needs {} MPI processes (mpirun -np {} megakern ... --tp {}), this run has {}", tp, tp, tp, tp,
         world.size());
  auto weights = std::make_shared<TpWeights>();
  model.set_program_transform(
      [&world, weights](const DecodeProgram& p) { return partition_tensor_parallel(p, world, *weights); });
  return world.rank();
}

void run_guarded(const std::function<void()>& body) {
  try {
    body();
    g_exit_code = 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    g_exit_code = 1;
    // Under mpirun the other ranks may be waiting for this one in a collective.
    mpi_abort_others(1);
  }
}

}  // namespace megakern::cli
