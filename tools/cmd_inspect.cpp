// `megakern inspect`: metadata and tensor table of a GGUF or safetensors model.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/units.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/model_format.h"
#include "io/safetensors.h"
#include "core/thread_pool.h"
#include "exec/executor.h"
#include "exec/race_check.h"
#include "exec/schedule.h"
#include "model/architecture.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "tools/commands.h"

namespace megakern::cli {
namespace {

struct InspectOptions {
  std::string model = "smollm2-135m";
  bool program = false;
  std::string config;
  int max_rows = 8;
  bool schedule = false;
  bool race_check = false;
  bool verbose_race = false;
  std::string workers = "1,2,3,8,64";
  std::string rows;  // empty: 1, 2, 7 and --max-rows
  bool no_tensors = false;
  bool no_metadata = false;
  size_t max_array = 8;
};

std::string value_str(const GGUFValue& v, size_t max_array) {
  auto scalar = [](const GGUFValue::Scalar& s) -> std::string {
    if (auto* u = std::get_if<uint64_t>(&s)) return std::to_string(*u);
    if (auto* i = std::get_if<int64_t>(&s)) return std::to_string(*i);
    if (auto* d = std::get_if<double>(&s)) return fmt::format("{}", *d);
    if (auto* b = std::get_if<bool>(&s)) return *b ? "true" : "false";
    const std::string& str = std::get<std::string>(s);
    std::string out = str.size() > 120 ? str.substr(0, 120) + "..." : str;
    for (auto& c : out)
      if (c == '\n') c = ' ';
    return "\"" + out + "\"";
  };
  if (v.type != GGUFValueType::ARRAY) return scalar(v.scalar);
  std::string out = fmt::format("array[{}] [", v.array_len);
  const size_t n = std::min<size_t>(max_array, v.array_len);
  for (size_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    if (!v.strings.empty())
      out += scalar(GGUFValue::Scalar{v.strings[i]});
    else if (!v.ints.empty())
      out += std::to_string(v.ints[i]);
    else
      out += fmt::format("{}", v.floats[i]);
  }
  if (v.array_len > n) out += ", ...";
  return out + "]";
}

void inspect_gguf(const std::string& path, const InspectOptions& o) {
  auto f = GGUFFile::open(path);
  fmt::print("file: {}\nformat: GGUF v{} ({} metadata keys, {} tensors, alignment {})\n", path, f->version(),
             f->metadata().size(), f->tensors().size(), f->alignment());
  if (!o.no_metadata) {
    fmt::print("\nmetadata:\n");
    for (const auto& k : f->metadata_order()) fmt::print("  {} = {}\n", k, value_str(*f->find(k), o.max_array));
  }
  uint64_t params = 0, bytes = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // name -> (tensors, bytes)
  for (const auto& t : f->tensors()) {
    params += t.n_elements;
    bytes += t.n_bytes;
    auto& e = by_type[dtype_traits(t.type).name];
    e.first++;
    e.second += t.n_bytes;
  }
  if (!o.no_tensors) {
    fmt::print("\ntensors:\n  {:<40} {:<6} {:<20} {:>12}\n", "name", "type", "shape", "bytes");
    for (const auto& t : f->tensors())
      fmt::print("  {:<40} {:<6} {:<20} {:>12}\n", t.name, dtype_traits(t.type).name, shape_str(t.shape), t.n_bytes);
  }
  fmt::print("\nsummary: {} parameters, {:.1f} MiB of tensor data\n", params, bytes / 1048576.0);
  for (const auto& [name, e] : by_type)
    fmt::print("  {:<6} {:>5} tensors {:>10.1f} MiB\n", name, e.first, e.second / 1048576.0);
}

void inspect_safetensors(const std::string& path, const InspectOptions& o) {
  auto m = SafetensorsModel::open(path);
  fmt::print("model: {}\nformat: safetensors ({} files, {} tensors)\n", path, m.files().size(), m.size());
  namespace fs = std::filesystem;
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  if (fs::is_regular_file(dir / "config.json")) {
    HFConfig cfg = HFConfig::load((dir / "config.json").string());
    fmt::print("config.json: model_type = {}\n", cfg.model_type());
  }
  if (!o.no_metadata && !m.metadata().empty()) {
    fmt::print("\nmetadata:\n");
    for (const auto& [k, v] : m.metadata()) fmt::print("  {} = {}\n", k, v);
  }
  uint64_t params = 0, bytes = 0;
  if (!o.no_tensors) fmt::print("\ntensors:\n  {:<50} {:<8} {:<20} {:>12}\n", "name", "dtype", "shape", "bytes");
  for (const auto* t : m.tensors()) {
    uint64_t n = 1;
    for (int64_t d : t->shape) n *= static_cast<uint64_t>(d);
    params += n;
    bytes += t->n_bytes;
    if (!o.no_tensors) fmt::print("  {:<50} {:<8} {:<20} {:>12}\n", t->name, t->dtype, shape_str(t->shape), t->n_bytes);
  }
  fmt::print("\nsummary: {} parameters, {:.1f} MiB of tensor data\n", params, bytes / 1048576.0);
}

void inspect_program(const InspectOptions& o) {
  const std::unique_ptr<Model> m = load_model(o.model);
  const DecodeProgram p = m->build_program(o.max_rows);
  fmt::print("{}", p.dump());
}

void inspect_config(const std::string& name) {
  const Architecture* a = architecture_of_preset(name);
  if (!a) fail("unknown config preset '{}' (known: {})", name, join_names(all_presets(/*runnable_only=*/false)));
  fmt::print("{}", a->describe(name));
}

// The megakernel schedules of a preset's full program, built from shapes
// only (no weight memory), with the time each took to compile.
void inspect_schedule(const std::string& name, int max_rows) {
  const Architecture* a = architecture_of_preset(name);
  const auto t0 = Clock::now();
  const std::unique_ptr<ArchModel> m = a ? a->shapes_only(name) : nullptr;
  if (!m) fail("--schedule: planning from a config without weights is available for the Kimi K3 presets (got '{}')", name);
  const DecodeProgram p = m->build_program(max_rows);
  const double build_program_ms = ms_since(t0);
  ThreadPool pool(0);
  fmt::print("{}: {} layers, {} ops, {} of weights read per step (shapes only, no weight memory); program built in "
             "{:.1f} ms\n",
             name, p.n_layer, p.ops.size(), human_bytes(static_cast<double>(p.weight_bytes())), build_program_ms);
  auto ex = make_mega_executor(p, pool);
  double total = 0;
  for (int rows = 1; rows <= max_rows; rows *= 2) {
    const auto t = Clock::now();
    ex->prepare(rows);
    const double ms = ms_since(t);
    total += ms;
    fmt::print("megakernel schedule, {} workers, batch {}: {:.2f} ms\n", pool.size(), rows, ms);
  }
  fmt::print("all batch sizes: {:.2f} ms\n", total);
}

// A list of counts: "1,2,8", "1-64" or both ("1-4,8"), each in [1, max].
std::vector<int> count_list(const std::string& flag, const std::string& text, int max) {
  std::vector<int> v;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    const size_t dash = item.find('-');
    int a = 0, b = 0;
    try {
      size_t used = 0;
      a = std::stoi(item.substr(0, dash), &used);
      if (used != (dash == std::string::npos ? item.size() : dash)) throw std::invalid_argument(item);
      b = a;
      if (dash != std::string::npos) {
        b = std::stoi(item.substr(dash + 1), &used);
        if (used != item.size() - dash - 1) throw std::invalid_argument(item);
      }
    } catch (const std::exception&) {
      fail("{} '{}': '{}' is not a count nor a range A-B", flag, text, item);
    }
    if (a < 1 || b > max || a > b) fail("{} '{}': '{}' is outside 1-{} (or an empty range)", flag, text, item, max);
    for (int x = a; x <= b; ++x) v.push_back(x);
    at = end + 1;
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// The race checker (exec/race_check.h) over a preset's full program, built
// from shapes only, for every team size and row count asked, plain and (for
// recurrent programs) with chained rows.
void inspect_race_check(const InspectOptions& o) {
  const Architecture* a = architecture_of_preset(o.config);
  const std::unique_ptr<ArchModel> m = a ? a->shapes_only(o.config) : nullptr;
  if (!m)
    fail("--race-check: '{}' has no shapes-only form (the full-size kimi-k3, muse-spark-1.2 and qwen3.8-27b presets "
         "and their minis have one)",
         o.config);
  const std::vector<int> workers = count_list("--workers", o.workers, 64);
  const std::vector<int> rows =
      count_list("--rows", o.rows.empty() ? fmt::format("1,2,{}", o.max_rows) + (o.max_rows > 7 ? ",7" : "") : o.rows,
                 o.max_rows);
  const DecodeProgram p = m->build_program(rows.back());
  fmt::print("{}: {} ops, {} slots; race check of the megakernel schedule at {} team sizes x {} row counts{}\n",
             o.config, p.ops.size(), p.slots.size(), workers.size(), rows.size(),
             p.recurrent ? ", each plain and with chained rows" : "");
  const auto t0 = Clock::now();
  RaceCheckStats sum;
  int schedules = 0;
  for (int w : workers)
    for (int r : rows)
      for (bool chained : {false, true}) {
        if (chained && !p.recurrent) continue;
        CompileOptions co;
        co.chained = chained;
        const auto t = Clock::now();
        const Schedule s = compile(p, r, w, co);
        const double compile_ms = ms_since(t);
        const RaceCheckStats st = race_check(p, s);
        ++schedules;
        sum.tiles += st.tiles;
        sum.accesses += st.accesses;
        sum.cells += st.cells;
        sum.orderings += st.orderings;
        sum.transitive += st.transitive;
        sum.same_op_pairs += st.same_op_pairs;
        if (o.verbose_race)
          fmt::print("  {} workers, {} rows{}: {} tiles, {} accesses, {} orderings ({} through other tiles), {} same-op "
                     "pairs: ok (compile {:.0f} ms, check {:.0f} ms)\n",
                     w, r, chained ? ", chained" : "", st.tiles, st.accesses, st.orderings, st.transitive,
                     st.same_op_pairs, compile_ms, ms_since(t) - compile_ms);
      }
  fmt::print("race check ok: {} schedules, {} tiles, {} derived accesses over {} cells, {} tile pairs ordered ({} "
             "through other tiles), {} pairs of one op's tiles meeting; {:.1f} s\n",
             schedules, sum.tiles, sum.accesses, sum.cells, sum.orderings, sum.transitive, sum.same_op_pairs,
             ms_since(t0) / 1000.0);
}

void inspect_cmd(const InspectOptions& o) {
  if (o.race_check) {
    if (o.config.empty()) fail("--race-check needs --config NAME (e.g. kimi-k3, muse-spark-1.2, qwen3.8-27b)");
    inspect_race_check(o);
    return;
  }
  if (o.schedule) {
    if (o.config.empty()) fail("--schedule needs --config NAME (a Kimi K3 preset, e.g. kimi-k3)");
    inspect_schedule(o.config, o.max_rows);
    return;
  }
  if (!o.config.empty()) {
    inspect_config(o.config);
    return;
  }
  if (o.program) {
    inspect_program(o);
    return;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(o.model, ec) || o.model.ends_with(".safetensors") || o.model.ends_with(".index.json")) {
    inspect_safetensors(o.model, o);
    return;
  }
  const std::string path = resolve_model_path(o.model);
  const SniffedFormat f = sniff_model_format(path);
  if (f.format == ModelFileFormat::GGUF)
    inspect_gguf(path, o);
  else if (f.format == ModelFileFormat::Safetensors)
    inspect_safetensors(path, o);
  else
    fail("{}: not a model file: {}", path, f.detail);
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect", "Show the metadata and tensor table of a GGUF or safetensors model");
  cmd->add_option("model", o->model, "GGUF file, safetensors file or directory, or a fetched model name")
      ->capture_default_str();
  cmd->add_option("-m,--model", o->model, "Same as the positional argument");
  cmd->add_flag("--program", o->program,
                "Print the model's DecodeProgram: ops per layer with the weight bytes each reads (also for bench presets)");
  cmd->add_option("--config", o->config,
                  "Describe an architecture preset (e.g. qwen3.8-27b): parameters, weights read per step, KV and state bytes");
  cmd->add_option("--max-rows", o->max_rows, "Rows per step the program is built for")->capture_default_str()->check(CLI::Range(1, 64));
  cmd->add_flag("--schedule", o->schedule,
                "With --config (Kimi K3 presets): build the full program from shapes alone and time the megakernel "
                "schedule build for batch 1, 2, 4, ... up to --max-rows");
  cmd->add_flag("--race-check", o->race_check,
                "With --config: build the full program from shapes alone and check the megakernel schedule's race "
                "freedom (exec/race_check.h) at each --workers and --rows count");
  cmd->add_option("--workers", o->workers, "With --race-check: team sizes, e.g. 1,2,8 or 1-64")->capture_default_str();
  cmd->add_option("--rows", o->rows, "With --race-check: row counts up to --max-rows, e.g. 1-64 (default 1,2,7,--max-rows)");
  cmd->add_flag("--verbose", o->verbose_race, "With --race-check: a line per schedule");
  cmd->add_flag("--no-tensors", o->no_tensors, "Omit the tensor table");
  cmd->add_flag("--no-metadata", o->no_metadata, "Omit the metadata");
  cmd->add_option("--max-array", o->max_array, "Array elements shown per metadata value")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30));
  cmd->callback([o] { run_guarded([&] { inspect_cmd(*o); }); });
}

}  // namespace megakern::cli
