// `megakern bench`: decode throughput of the op-by-op and megakernel
// executors over the same program, side by side in one run, next to this
// machine's read bandwidth measured in the same run.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "io/mmap_file.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "exec/executor.h"
#include "kernels/cpu/isa.h"
#include "runtime/engine.h"
#include "runtime/model.h"
#include "dist/mpi_comm.h"
#include "tools/commands.h"
#include "tools/spec_cli.h"

namespace megakern::cli {
namespace {


struct BenchOptions {
  std::string model = "dense-bench";
  ModelFlags model_flags;
  std::string batches = "1,2,4,8";
  std::string executors = "opbyop,mega";
  int steps = 16;
  int warmup = 3;
  int rounds = 2;
  int threads = 0;
  std::string json;
  std::string trace;
  std::string svg;
  size_t probe_mib = 1024;
  size_t prefetch_kib = MegaOptions{}.prefetch_bytes / 1024;
  int prompt = 0;    // --prompt N: prompt-processing tok/s for N tokens
  int ubatch = 0;    // rows per prompt step on the executor path (0: the engine's default)
  int tp = 1;        // --tp N: tensor parallelism over the N processes of mpirun
  SpecBenchOptions spec;  // --spec: the speculative decoding benchmark instead
};

// Read bandwidth: every worker of the pool sums its share of a buffer much
// larger than the last-level cache; best of three passes.
double probe_bandwidth_gbs(ThreadPool& pool, size_t mib) {
  const size_t n = mib * 1024 * 1024 / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;
  std::vector<uint64_t> sums(static_cast<size_t>(pool.size()) * 8);
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = Clock::now();
    const int W = pool.size();
    pool.run([&](int w) {
      const int64_t b = static_cast<int64_t>(n) * w / W, e = static_cast<int64_t>(n) * (w + 1) / W;
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t i = b;
      for (; i + 4 <= e; i += 4) {
        s0 += buf[static_cast<size_t>(i)];
        s1 += buf[static_cast<size_t>(i + 1)];
        s2 += buf[static_cast<size_t>(i + 2)];
        s3 += buf[static_cast<size_t>(i + 3)];
      }
      for (; i < e; ++i) s0 += buf[static_cast<size_t>(i)];
      sums[static_cast<size_t>(w) * 8] = s0 + s1 + s2 + s3;
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s / 1e9);
  }
  volatile uint64_t sink = sums[0];
  (void)sink;
  return best;
}

struct Result {
  std::string executor;
  int batch = 0;
  double ms_per_step = 0;
  double tokens_per_s = 0;
  double gbs = 0;
  double mb_per_step = 0;  // weights + per-row state moved
};

// Best-of-rounds ms per step of `steps` steps at batch size b.
double time_steps(const Model& m, Executor& ex, int b, int warmup, int steps) {
  const int n_ctx = warmup + steps + 8;
  std::vector<SequenceState> seqs;
  for (int r = 0; r < b; ++r) seqs.push_back(m.new_sequence(n_ctx));
  std::vector<float> logits(static_cast<size_t>(b) * static_cast<size_t>(m.n_vocab()));
  std::vector<RowInput> rows(static_cast<size_t>(b));
  Clock::time_point t0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) t0 = Clock::now();
    for (int r = 0; r < b; ++r)
      rows[static_cast<size_t>(r)] =
          seqs[static_cast<size_t>(r)].row(static_cast<int32_t>((s * 7 + r * 13 + 1) % m.n_vocab()), s);
    ex.step(rows, logits.data());
  }
  return ms_since(t0) / steps;
}

// A grouped bar chart of tokens/s per batch size, one bar per executor.
void write_svg(const std::string& path, const std::string& model, const std::vector<std::string>& execs,
               const std::vector<int>& batches, const std::vector<Result>& results) {
  const int W = 640, H = 360, left = 60, bottom = 40, top = 40;
  double ymax = 0;
  for (const auto& r : results) ymax = std::max(ymax, r.tokens_per_s);
  ymax = ymax > 0 ? ymax * 1.15 : 1;
  const char* colors[] = {"#8c8c8c", "#d62728", "#1f77b4", "#2ca02c"};
  std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  s += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"14\">{}: decode tokens/s by batch size</text>\n", left, model);
  const int plot_w = W - left - 20, plot_h = H - top - bottom;
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", left, top, top + plot_h);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", left, top + plot_h, left + plot_w);
  for (int k = 0; k <= 4; ++k) {
    const double v = ymax * k / 4;
    const int y = top + plot_h - static_cast<int>(plot_h * k / 4);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0f}</text>\n", left - 6, y + 4, v);
  }
  const double group_w = static_cast<double>(plot_w) / static_cast<double>(batches.size());
  const double bar_w = group_w * 0.8 / static_cast<double>(execs.size());
  for (size_t g = 0; g < batches.size(); ++g) {
    for (size_t e = 0; e < execs.size(); ++e) {
      for (const auto& r : results) {
        if (r.batch != batches[g] || r.executor != execs[e]) continue;
        const double h = plot_h * r.tokens_per_s / ymax;
        const double x = left + g * group_w + group_w * 0.1 + e * bar_w;
        s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", x,
                         top + plot_h - h, bar_w - 2, h, colors[e % 4]);
        s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"10\">{:.1f}</text>\n",
                         x + bar_w / 2, top + plot_h - h - 3, r.tokens_per_s);
      }
    }
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">batch {}</text>\n", left + g * group_w + group_w / 2,
                     top + plot_h + 18, batches[g]);
  }
  for (size_t e = 0; e < execs.size(); ++e) {
    const int x = left + 10 + static_cast<int>(e) * 120;
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n", x,
                     H - 16, colors[e % 4], x + 16, H - 6, execs[e]);
  }
  s += "</svg>\n";
  std::ofstream out(path);
  if (!out) fail("--svg: cannot write '{}'", path);
  out << s;
}

// Traces of several executors (trace_to_json's output each) into one file,
// each executor a process of its own in the trace viewer.
void write_merged_trace(const std::string& path, const std::vector<std::string>& names,
                        const std::vector<std::string>& traces, const std::string& what) {
  std::string merged = "{\"traceEvents\":[\n";
  bool first = true;
  for (size_t i = 0; i < traces.size(); ++i) {
    // Strip the wrapper and renumber the process id.
    const std::string& one = traces[i];
    const size_t b = one.find('[') + 1, e = one.rfind(']');
    std::string body = one.substr(b, e - b);
    for (size_t pos = 0; (pos = body.find("\"pid\":1", pos)) != std::string::npos; pos += 6)
      body.replace(pos, 7, fmt::format("\"pid\":{}", i + 1));
    if (body.find_first_not_of(" \n") == std::string::npos) continue;
    merged += (first ? "" : ",\n") + body;
    first = false;
    merged += fmt::format(",\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"args\":{{\"name\":\"{} {}\"}}}}",
                          i + 1, names[i], what);
  }
  merged += "\n]}\n";
  std::ofstream out(path);
  if (!out) fail("--trace: cannot write '{}'", path);
  out << merged;
}

// --prompt N: prompt processing. Every (mode, executor) computes the same
// N-token prompt from position 0 as the engine does it (executor steps of
// --ubatch rows), the rounds alternating the order; the best time of each is
// kept.
void bench_prompt(const BenchOptions& o, Model& M, ThreadPool& pool, const std::vector<Numerics>& modes,
                  double load_ms) {
  const auto execs = split_list(o.executors);
  const int n = o.prompt;
  const int ub = o.ubatch > 0 ? o.ubatch : default_prompt_block(M);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 17) % M.n_vocab());
  struct Case {
    std::string name;
    Numerics mode;
    std::unique_ptr<Engine> engine;
  };
  std::vector<Case> cases;
  for (Numerics m : modes) {
    M.set_numerics(m);
    for (const auto& e : execs) {
      if (e != "opbyop" && e != "mega" && e != "reference")
        fail("--prompt: executor '{}' is not one of opbyop, mega, reference", e);
      cases.push_back({e + "/" + numerics_name(m), m, std::make_unique<Engine>(M, pool, ub, e)});
      cases.back().engine->set_prefill_rows(ub);
    }
  }
  fmt::print("model {}, load {:.0f} ms; prompt of {} tokens, {} threads, best of {} rounds; {}\n", M.name(), load_ms, n,
             pool.size(), o.rounds,
             fmt::format("executor steps of {} rows", ub));
  std::vector<float> logits(static_cast<size_t>(M.n_vocab()));
  std::vector<double> best(cases.size(), 1e300);
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t k = 0; k < cases.size(); ++k) {
      const size_t i = round % 2 ? cases.size() - 1 - k : k;
      M.set_numerics(cases[i].mode);
      SequenceState seq = M.new_sequence(n + 1);
      const auto t0 = Clock::now();
      cases[i].engine->prefill(seq, tokens.data(), n, 0, logits.data());
      best[i] = std::min(best[i], ms_since(t0));
    }
  }
  if (!o.trace.empty()) {
    // The prompt's last block (positions n - ub .. n - 1: all but its last
    // row head-less, then that row with the output head) traced once per
    // case.
    std::vector<std::string> bodies, names;
    const int head = std::max(0, n - ub);
    for (auto& c : cases) {
      M.set_numerics(c.mode);
      SequenceState seq = M.new_sequence(n + 1);
      if (head > 0) c.engine->prefill(seq, tokens.data(), head, 0, logits.data());
      std::vector<TraceEvent> events;
      c.engine->set_trace(&events);
      c.engine->prefill(seq, tokens.data() + head, n - head, head, logits.data());
      c.engine->set_trace(nullptr);
      bodies.push_back(trace_to_json(c.engine->program(), events));
      names.push_back(c.name);
    }
    write_merged_trace(o.trace, names, bodies, fmt::format("prompt block {}..{}", head, n - 1));
    fmt::print("trace of the prompt's last block per case written to {}\n", o.trace);
  }
  fmt::print("\n{:<16} {:>10} {:>10} {:>9}\n", "executor/mode", "ms", "tokens/s", "speedup");
  for (size_t i = 0; i < cases.size(); ++i)
    fmt::print("{:<16} {:>10.1f} {:>10.1f} {:>8.2f}x\n", cases[i].name, best[i], n * 1000.0 / best[i], best[0] / best[i]);
  if (!o.json.empty()) {
    nlohmann::json j;
    j["model"] = M.name();
    j["threads"] = pool.size();
    j["prompt_tokens"] = n;
    for (size_t i = 0; i < cases.size(); ++i)
      j["results"].push_back({{"case", cases[i].name}, {"ms", best[i]}, {"tokens_per_s", n * 1000.0 / best[i]}});
    std::ofstream out(o.json);
    if (!out) fail("--json: cannot write '{}'", o.json);
    out << j.dump(2) << "\n";
  }
}

void bench_cmd(const BenchOptions& o) {
  std::vector<int> batches;
  for (const auto& s : split_list(o.batches)) {
    int b = 0;
    try {
      size_t used = 0;
      b = std::stoi(s, &used);
      if (used != s.size()) throw std::invalid_argument(s);
    } catch (const std::exception&) {
      fail("--batch: '{}' is not a number (expected a list such as 1,2,4,8)", s);
    }
    if (b < 1 || b > 64) fail("--batch: {} is outside 1..64", b);
    batches.push_back(b);
  }
  if (batches.empty()) fail("--batch needs at least one batch size");
  const auto execs = split_list(o.executors);
  if (execs.empty()) fail("--executor needs at least one of opbyop, mega, reference");
  for (const auto& e : execs)
    if (e != "opbyop" && e != "mega" && e != "reference" && e != "mega-nopf" && e != "mega-noexp" &&
        e != "mega-noshare")
      fail("--executor: unknown executor '{}' (expected opbyop, mega, reference, mega-nopf, mega-noexp or mega-noshare)",
           e);

  // --numerics may list several modes: every executor runs in each.
  std::vector<Numerics> modes;
  for (const auto& s : split_list(o.model_flags.numerics)) modes.push_back(parse_numerics(s));
  if (modes.empty()) fail("--numerics needs at least one of exact, fast");
  ModelFlags flags = o.model_flags;
  flags.numerics = numerics_name(modes[0]);

  ThreadPool pool(o.threads);
  fmt::print(stderr, "[bench] loading {} ...\n", o.model);
  const auto t_load = Clock::now();
  const std::unique_ptr<Model> model = load_model(o.model, flags.options());
  Model& M = *model;
  const int rank = apply_tensor_parallel(M, o.tp);
  if (rank != 0 && !std::freopen("/dev/null", "w", stdout)) fail("rank {}: cannot silence stdout", rank);
  if (o.tp > 1 && o.prompt > 0) fail("--tp does not combine with --prompt yet");
  const double load_ms = ms_since(t_load);
  if (o.prompt > 0) return bench_prompt(o, M, pool, modes, load_ms);
  const int max_b = *std::max_element(batches.begin(), batches.end());
  // One program per mode (executors refer to theirs), the first one's
  // figures printed.
  std::vector<std::unique_ptr<DecodeProgram>> progs;
  for (Numerics m : modes) {
    M.set_numerics(m);
    progs.push_back(std::make_unique<DecodeProgram>(M.build_program(max_b)));
  }
  const DecodeProgram& prog = *progs[0];
  const double weight_mb = static_cast<double>(prog.weight_bytes()) / 1e6;
  fmt::print(stderr, "[bench] probing read bandwidth ({} MiB buffer, {} threads) ...\n", o.probe_mib, pool.size());
  const double probe = probe_bandwidth_gbs(pool, o.probe_mib);

  std::vector<std::unique_ptr<Executor>> ex;
  std::vector<double> build_ms;
  std::vector<std::string> names = execs;
  if (modes.size() > 1) {
    names.clear();
    for (Numerics m : modes)
      for (const auto& e : execs) names.push_back(e + "/" + numerics_name(m));
  }
  for (size_t mi = 0; mi < modes.size(); ++mi) {
    for (const auto& e : execs) {
      if (e.rfind("mega", 0) == 0) {
        MegaOptions mo;
        mo.prefetch_bytes = e == "mega-nopf" ? 0 : o.prefetch_kib * 1024;
        mo.prefetch_experts = e != "mega-noexp";
        mo.share_matmuls = e != "mega-noshare";
        ex.push_back(make_mega_executor(*progs[mi], pool, mo));
      } else {
        ex.push_back(make_executor(e, *progs[mi], pool));
      }
      const auto t0 = Clock::now();
      for (int b : batches) ex.back()->prepare(b);
      build_ms.push_back(ms_since(t0));
    }
  }

  fmt::print("model {} ({} layers, {} ops), weights read per step {:.1f} MB, load {:.0f} ms\n", M.name(),
             prog.n_layer, prog.ops.size(), weight_mb, load_ms);
  fmt::print("threads {}, read bandwidth probe {:.2f} GB/s; {} timed steps per point, best of {} rounds; "
             "megakernel prefetch {} KiB\n",
             pool.size(), probe, o.steps, o.rounds, o.prefetch_kib);
  fmt::print("kernels: {}\n", isa_report());
  fmt::print("weights repacked for the host's kernels: {:.1f} MB; resident memory after load {:.1f} MB\n",
             (double)M.packed_weight_bytes() / 1e6, (double)resident_bytes() / 1e6);
  for (size_t i = 0; i < names.size(); ++i)
    fmt::print("schedule build ({}, batch sizes {}): {:.2f} ms\n", names[i], o.batches, build_ms[i]);
  if (prog.has_routed_experts())
    fmt::print("routed experts: bytes per step count the expected distinct experts of the batch's rows under uniform "
               "routing (batch 1: top-k experts)\n");
  fmt::print("state moved per row and step (KV read and written, recurrent state read and written): {:.2f} MB\n",
             static_cast<double>(prog.state_bytes_per_row(o.warmup + o.steps / 2)) / 1e6);
  fmt::print("\n{:<10} {:>5} {:>10} {:>10} {:>9} {:>9} {:>8} {:>9}\n", "executor", "batch", "ms/step", "tokens/s",
             "MB/step", "GB/s", "%probe", "speedup");

  std::vector<Result> results;
  Communicator* world = o.tp > 1 ? &mpi_world() : nullptr;
  const uint64_t sent0 = world ? world->sent_floats : 0;
  const double coll0 = world ? world->seconds : 0;
  long steps_run = 0;
  for (int b : batches) {
    std::vector<double> best(names.size(), 1e300);
    // Rounds alternate the executors' order so slow drift in machine
    // state affects both alike.
    for (int round = 0; round < o.rounds; ++round)
      for (size_t k = 0; k < names.size(); ++k) {
        // Odd rounds run the executors in reverse order.
        const size_t i = round % 2 ? names.size() - 1 - k : k;
        best[i] = std::min(best[i], time_steps(M, *ex[i], b, o.warmup, o.steps));
        steps_run += o.warmup + o.steps;
      }
    const double base = best[0];
    for (size_t i = 0; i < names.size(); ++i) {
      Result r;
      r.executor = names[i];
      r.batch = b;
      r.ms_per_step = best[i];
      r.tokens_per_s = b * 1000.0 / best[i];
      // Weights once, plus each row's KV and recurrent state at the mean
      // timed position.
      const int mean_pos = o.warmup + o.steps / 2;
      r.mb_per_step = prog.weight_bytes_for_rows(b) / 1e6 + b * static_cast<double>(prog.state_bytes_per_row(mean_pos)) / 1e6;
      r.gbs = r.mb_per_step / best[i];  // MB per ms = GB/s
      results.push_back(r);
      fmt::print("{:<10} {:>5} {:>10.3f} {:>10.1f} {:>9.1f} {:>9.2f} {:>7.1f}% {:>8.2f}x\n", r.executor, b,
                 r.ms_per_step, r.tokens_per_s, r.mb_per_step, r.gbs, 100.0 * r.gbs / probe, base / best[i]);
    }
  }
  const size_t rss_run = resident_bytes();
  fmt::print("resident memory after the timed steps: {:.1f} MB\n", (double)rss_run / 1e6);
  if (world) {
    // Per rank: weight bytes of its program, and per step (every executor and
    // batch size alike) the bytes it sent in collectives and the time spent in them.
    const float mine[4] = {static_cast<float>(prog.weight_bytes() / 1e6),
                           static_cast<float>((world->sent_floats - sent0) * sizeof(float) / 1e3 / steps_run),
                           static_cast<float>((world->seconds - coll0) * 1e3 / steps_run),
                           static_cast<float>(rss_run / 1e6)};
    std::vector<size_t> counts(static_cast<size_t>(world->size()), 4);
    std::vector<float> all(4 * counts.size());
    world->all_gather(mine, counts.data(), all.data());
    fmt::print("\ntensor parallelism over {} ranks (mean over the {} steps run):\n", world->size(), steps_run);
    fmt::print("{:<6} {:>12} {:>16} {:>18} {:>10}\n", "rank", "weights MB", "collective KB/step",
               "collective ms/step", "RSS MB");
    for (int p = 0; p < world->size(); ++p)
      fmt::print("{:<6} {:>12.1f} {:>16.2f} {:>18.3f} {:>10.1f}\n", p, all[4 * p], all[4 * p + 1], all[4 * p + 2],
                 all[4 * p + 3]);
  }
  if (!o.trace.empty()) {
    // One traced step per executor at the largest batch.
    std::vector<std::string> bodies;
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<TraceEvent> events;
      ex[i]->set_trace(&events);
      time_steps(M, *ex[i], max_b, 0, 1);
      ex[i]->set_trace(nullptr);
      bodies.push_back(trace_to_json(prog, events));
    }
    write_merged_trace(o.trace, names, bodies, fmt::format("batch {}", max_b));
    fmt::print("trace of one step per executor at batch {} written to {}\n", max_b, o.trace);
  }
  if (!o.svg.empty()) {
    write_svg(o.svg, M.name(), names, batches, results);
    fmt::print("chart written to {}\n", o.svg);
  }
  if (!o.json.empty()) {
    nlohmann::json j;
    j["model"] = M.name();
    j["threads"] = pool.size();
    j["probe_gbs"] = probe;
    j["kernels"] = isa_name(active_isa());
    j["weight_bytes_per_step"] = prog.weight_bytes();
    j["packed_weight_bytes"] = M.packed_weight_bytes();
    j["resident_bytes_after_steps"] = rss_run;
    j["steps"] = o.steps;
    for (size_t i = 0; i < names.size(); ++i) j["schedule_build_ms"][names[i]] = build_ms[i];
    for (const auto& r : results)
      j["results"].push_back({{"executor", r.executor},
                              {"batch", r.batch},
                              {"ms_per_step", r.ms_per_step},
                              {"tokens_per_s", r.tokens_per_s},
                              {"bytes_per_step", r.mb_per_step * 1e6},
                              {"gbs", r.gbs},
                              {"fraction_of_probe", r.gbs / probe}});
    std::ofstream out(o.json);
    if (!out) fail("--json: cannot write '{}'", o.json);
    out << j.dump(2) << "\n";
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Decode benchmark: op-by-op vs megakernel executors, with a bandwidth probe");
  add_model_flags(cmd, o->model, o->model_flags);
  cmd->add_option("--batch", o->batches, "Comma-separated batch sizes (rows per step)")->capture_default_str();
  cmd->add_option("--executor", o->executors, "Comma-separated executors (opbyop, mega, reference; ablations: mega-nopf = megakernel "
                  "without weight prefetch, mega-noexp = without routed-expert prefetch, mega-noshare = without shared matrix-product tiles); the first is the speedup "
                  "baseline")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Timed steps per point")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", o->warmup, "Untimed steps first")->capture_default_str()->check(CLI::Range(0, 1000));
  cmd->add_option("--rounds", o->rounds, "Repetitions per point (best is kept)")->capture_default_str()->check(CLI::Range(1, 100));
  add_tp_flag(cmd, o->tp);
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0: one per core)")->capture_default_str()->check(CLI::Range(0, 1024));
  cmd->add_option("--probe-mib", o->probe_mib, "Bandwidth probe buffer size in MiB")->capture_default_str()->check(CLI::Range(64, 16384));
  cmd->add_option("--prefetch-kib", o->prefetch_kib,
                  "Megakernel: KiB of upcoming weights each worker may prefetch ahead (0 disables)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--prompt", o->prompt,
                  "Prompt processing instead of decode: tokens/s of an N-token prompt per executor and mode")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--ubatch", o->ubatch, "With --prompt: rows per executor step (default: the prompt block of megakern run)")
      ->check(CLI::Range(1, 512));
  check_output_file(cmd->add_option("--json", o->json, "Also write the results to this JSON file"));
  check_output_file(cmd->add_option("--trace", o->trace, "Write a Chrome/Perfetto trace of one step per executor (largest batch; with --prompt, the prompt's last block)"));
  check_output_file(cmd->add_option("--svg", o->svg, "Write a bar chart of tokens/s per batch size"));
  o->spec.drafters.clear();
  add_spec_bench_options(cmd, o->spec, true);
  cmd->callback([o] {
    run_guarded([&] {
      if (o->spec.drafters.empty()) return bench_cmd(*o);
      SpecBenchOptions so = o->spec;
      so.model = o->model;
      so.numerics = o->model_flags.numerics;
      so.kv_type = o->model_flags.kv_type;
      so.threads = o->threads;
      so.json = o->json;
      spec_bench_cmd(so);
    });
  });
}

}  // namespace megakern::cli
