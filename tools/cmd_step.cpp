// `megakern step`: one decode step of a model's program, for bisecting a
// wrong result: stop after any op and print the slot it wrote, run the
// program cut to its first layers, compare with the scalar reference.
#include <CLI/CLI.hpp>

#include <limits>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "exec/schedule.h"
#include "runtime/model.h"
#include "tools/commands.h"

namespace megakern::cli {
namespace {

struct StepOptions {
  std::string model = "smollm2-135m";
  ModelFlags flags;
  std::string prompt = "The capital of France is";
  std::string executor = "serial";
  int rows = 1;
  int workers = 2;
  int stop_after_op = -1;
  int layers = 0;
  std::string slot;
  int values = 6;
  bool compare = false;
  double bisect = 0;
};

uint64_t fnv1a(const float* x, int n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(x);
  for (size_t i = 0; i < sizeof(float) * static_cast<size_t>(n); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// One run: prefill the prompt's first tokens one row per step, then the last
// `rows` tokens as one block; returns the chosen slot's rows after the step.
std::vector<float> run_once(const Model& model, const DecodeProgram& prog, const StepOptions& o, Executor& ex,
                            const std::vector<int32_t>& tokens, int slot) {
  SequenceState seq = model.new_sequence(static_cast<int>(tokens.size()) + 1);
  std::vector<float> logits(static_cast<size_t>(o.rows) * static_cast<size_t>(prog.n_vocab));
  const int first = static_cast<int>(tokens.size()) - o.rows;
  auto* serial = dynamic_cast<SerialExecutor*>(&ex);
  if (serial) serial->set_stop_after_op(-1);
  for (int p = 0; p < first; ++p) ex.step({seq.row(tokens[static_cast<size_t>(p)], p)}, logits.data());
  std::vector<RowInput> block;
  for (int p = first; p < static_cast<int>(tokens.size()); ++p) block.push_back(seq.row(tokens[static_cast<size_t>(p)], p));
  if (serial) serial->set_stop_after_op(o.stop_after_op);
  ex.step(block, logits.data());
  const int w = prog.slots[static_cast<size_t>(slot)].width;
  std::vector<float> out(static_cast<size_t>(o.rows) * static_cast<size_t>(w));
  for (int r = 0; r < o.rows; ++r) {
    const float* src = slot == prog.logits_slot ? logits.data() + static_cast<size_t>(r) * prog.n_vocab
                                                : serial->slot_row(slot, r);
    std::memcpy(out.data() + static_cast<size_t>(r) * w, src, sizeof(float) * static_cast<size_t>(w));
  }
  return out;
}

std::unique_ptr<Executor> make(const std::string& kind, const DecodeProgram& prog, int workers, ThreadPool& pool) {
  if (kind == "serial") return std::make_unique<SerialExecutor>(prog, workers, false);
  if (kind == "reference") return std::make_unique<SerialExecutor>(prog, 1, true);
  return make_executor(kind, prog, pool);
}

// The largest difference between two runs' rows, relative to the largest reference value.
double rel_diff(const std::vector<float>& x, const std::vector<float>& ref) {
  double d = 0, m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == ref[i]) continue;
    d = std::max(d, static_cast<double>(std::fabs(x[i] - ref[i])));
    m = std::max(m, static_cast<double>(std::fabs(ref[i])));
  }
  for (float v : ref) m = std::max(m, static_cast<double>(std::fabs(v)));
  return d > 0 && !(d < INFINITY) ? INFINITY : m > 0 ? d / m : d;
}

// Runs the step to each op in turn against the reference and reports the
// first op whose output differs from it by more than tol.
void bisect(const Model& model, const DecodeProgram& prog, StepOptions o, const std::vector<int32_t>& tokens) {
  SerialExecutor ex(prog, o.workers, o.executor == "reference"), ref(prog, 1, true);
  for (size_t i = 0; i < prog.ops.size(); ++i) {
    const Op& op = prog.ops[i];
    if (op.out < 0 || prog.slots[static_cast<size_t>(op.out)].width == 0) continue;
    o.stop_after_op = static_cast<int>(i);
    const double d = rel_diff(run_once(model, prog, o, ex, tokens, op.out), run_once(model, prog, o, ref, tokens, op.out));
    if (d > o.bisect) {
      fmt::print("first op over {:.3g} of the reference: op {} ({} '{}' layer {}), {:.3g}\n", o.bisect, i,
                 op_kind_name(op.kind), op.name, op.layer, d);
      return;
    }
  }
  fmt::print("every op's output is within {:.3g} of the reference\n", o.bisect);
}

void step_cmd(const StepOptions& o) {
  auto model = load_model(o.model, o.flags.options());
  DecodeProgram full = model->build_program(std::max(o.rows, 1));
  const DecodeProgram prog = o.layers > 0 ? truncate_layers(full, o.layers) : full;
  const std::vector<int32_t> tokens = model->tokenizer().encode(o.prompt, model->tokenizer().add_bos_default(), false);
  if (static_cast<int>(tokens.size()) < o.rows)
    fail("--rows {}: the prompt has only {} tokens", o.rows, tokens.size());
  const bool stops = o.stop_after_op >= 0 || !o.slot.empty();
  if (stops && o.executor != "serial" && o.executor != "reference")
    fail("--stop-after-op and --slot need --executor serial or reference (got '{}')", o.executor);
  if (o.stop_after_op >= static_cast<int>(prog.ops.size()))
    fail("--stop-after-op {}: the program has ops 0 to {}", o.stop_after_op, prog.ops.size() - 1);
  int slot = prog.logits_slot;
  if (o.stop_after_op >= 0) slot = prog.ops[static_cast<size_t>(o.stop_after_op)].out;
  if (!o.slot.empty()) {
    slot = -1;
    const int layer = o.stop_after_op >= 0 ? prog.ops[static_cast<size_t>(o.stop_after_op)].layer : -1;
    for (size_t s = 0; s < prog.slots.size(); ++s)
      if (prog.slots[s].name == o.slot && (slot < 0 || prog.slots[s].layer == layer)) slot = static_cast<int>(s);
    if (slot < 0) fail("--slot: the program has no slot '{}'", o.slot);
  }
  if (slot < 0) fail("op {} writes no slot (a tap); name one with --slot", o.stop_after_op);
  if (o.bisect > 0) {
    if (o.executor != "serial" && o.executor != "reference") fail("--bisect needs --executor serial or reference");
    bisect(*model, prog, o, tokens);
    return;
  }
  ThreadPool pool(o.executor == "serial" || o.executor == "reference" ? 1 : o.workers);
  auto ex = make(o.executor, prog, o.workers, pool);
  const auto got = run_once(*model, prog, o, *ex, tokens, slot);
  std::vector<float> ref;
  if (o.compare) {
    auto rex = make("reference", prog, 1, pool);
    ref = run_once(*model, prog, o, *rex, tokens, slot);
  }
  fmt::print("{}: {} ops, {} layers, executor {}, {} prompt tokens, last {} as one step\n", prog.model_name,
             prog.ops.size(), prog.n_layer, o.executor, tokens.size(), o.rows);
  if (o.stop_after_op >= 0) {
    const Op& op = prog.ops[static_cast<size_t>(o.stop_after_op)];
    fmt::print("stopped after op {}: {} '{}' layer {}\n", o.stop_after_op, op_kind_name(op.kind), op.name, op.layer);
  }
  const int w = prog.slots[static_cast<size_t>(slot)].width;
  fmt::print("slot '{}' (layer {}), {} floats per row\n", prog.slots[static_cast<size_t>(slot)].name,
             prog.slots[static_cast<size_t>(slot)].layer, w);
  for (int r = 0; r < o.rows; ++r) {
    const float* x = got.data() + static_cast<size_t>(r) * w;
    double mx = 0, sum = 0;
    for (int i = 0; i < w; ++i) {
      mx = std::max(mx, static_cast<double>(std::fabs(x[i])));
      sum += std::fabs(x[i]);
    }
    std::string vals;
    for (int i = 0; i < std::min(w, o.values); ++i) vals += fmt::format(" {:.6g}", x[i]);
    fmt::print("row {}: hash {:016x} max|x| {:.6g} mean|x| {:.6g}:{}\n", r, fnv1a(x, w), mx, w ? sum / w : 0.0, vals);
    if (o.compare) {
      const float* y = ref.data() + static_cast<size_t>(r) * w;
      double d = 0, m = 0;
      for (int i = 0; i < w; ++i) {
        d = std::max(d, static_cast<double>(std::fabs(x[i] - y[i])));
        m = std::max(m, static_cast<double>(std::fabs(y[i])));
      }
      fmt::print("       vs reference: max |diff| {:.3g} ({:.3g} of max |ref|), reference hash {:016x}\n", d,
                 m > 0 ? d / m : d, fnv1a(y, w));
    }
  }
}

}  // namespace

void register_step(CLI::App& app) {
  auto o = std::make_shared<StepOptions>();
  auto* cmd = app.add_subcommand("step", "Run one decode step of a model's program for debugging: stop after an op, "
                                         "cut layers, compare with the scalar reference");
  add_model_flags(cmd, o->model, o->flags);
  cmd->add_option("-p,--prompt", o->prompt, "Text whose tokens are fed (raw, no chat template)")->capture_default_str();
  cmd->add_option("--rows", o->rows, "The prompt's last N tokens form the examined step (one block of N rows)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--executor", o->executor,
                  "serial (the megakernel schedule on one thread), reference (scalar kernels, program order), mega, opbyop")
      ->capture_default_str()
      ->check(CLI::IsMember({"serial", "reference", "mega", "opbyop"}));
  cmd->add_option("-t,--threads", o->workers, "Workers the schedule is compiled for (serial) or run on")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--stop-after-op", o->stop_after_op,
                  "Stop the examined step after op N (see inspect --program) and print the slot it wrote")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--layers", o->layers, "Run the program cut after its first N layers (global ops kept)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--slot", o->slot, "Print this slot instead (by name; with --stop-after-op, of that op's layer)");
  cmd->add_option("--values", o->values, "Values printed per row")->capture_default_str()->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--compare", o->compare, "Also run the scalar reference and print the difference per row");
  check_finite(cmd->add_option("--bisect", o->bisect,
                  "Run the step to each op in turn and report the first whose output differs from the scalar "
                  "reference's by more than this share of its largest value (e.g. 1e-3)"),
               0, false, std::numeric_limits<double>::infinity());
  cmd->callback([o] { run_guarded([&] { step_cmd(*o); }); });
}

}  // namespace megakern::cli
