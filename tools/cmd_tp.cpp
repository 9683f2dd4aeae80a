// megakern tp-check: tensor parallelism checked end to end. Under
// `mpirun -np N megakern tp-check --tp N`, every rank decodes greedily with
// its part of the model's program (dist/tensor_parallel.h); rank 0 then runs
// the same partition in-process (N threads, dist/local_comm.h) and the
// unpartitioned program, and checks that
//  - every rank chose the same tokens (rank 0's broadcast after each step);
//  - the logits of every step equal the in-process emulation's bit for bit;
//  - the greedy tokens equal the unpartitioned program's, and its logits lie
//    within --tol (max |difference| over max |logit|).
// With --local the N ranks are only the in-process ones (no MPI needed).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/thread_pool.h"
#include "dist/local_comm.h"
#include "dist/mpi_comm.h"
#include "dist/tensor_parallel.h"
#include "runtime/engine.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "tools/commands.h"

namespace megakern::cli {
namespace {

struct TpCheckOptions {
  std::string model = "dense-mini";
  ModelFlags flags;
  std::string prompt = "The capital of France is";
  std::string executor = "mega";
  int tp = 2, steps = 16, threads = 1;
  double tol = 1e-3;
  bool local = false;
};

// Greedy decoding's tokens and the logits of every step ([steps + 1][V]: the
// prompt's last position, then each generated token's).
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

Trace greedy(const Model& m, const TpCheckOptions& o, const std::vector<int32_t>& prompt, Communicator* agree) {
  ThreadPool pool(o.threads);
  Engine eng(m, pool, 8, o.executor);
  const int n = static_cast<int>(prompt.size());
  SequenceState seq = m.new_sequence(std::max(16, n + o.steps + 1));
  const int V = m.n_vocab();
  std::vector<float> lg(static_cast<size_t>(V));
  eng.prefill(seq, prompt.data(), n, 0, lg.data());
  Trace t;
  t.logits = lg;
  for (int i = 0; i < o.steps; ++i) {
    const int32_t tok = argmax(lg.data(), V);
    if (agree) {
      int32_t chosen = tok;
      agree->broadcast(&chosen, 1, 0);
      if (chosen != tok)
        fail("rank {} chose token {} at step {}, rank 0 chose {}", agree->rank(), tok, i, chosen);
    }
    t.tokens.push_back(tok);
    eng.step({seq.row(tok, n + i)}, lg.data());
    t.logits.insert(t.logits.end(), lg.begin(), lg.end());
  }
  return t;
}

std::unique_ptr<Model> load_part(const TpCheckOptions& o, Communicator& c, std::shared_ptr<TpWeights> w) {
  std::unique_ptr<Model> m = load_model(o.model, o.flags.options());
  m->set_program_transform([&c, w](const DecodeProgram& p) { return partition_tensor_parallel(p, c, *w); });
  return m;
}

// The in-process run of the same partition: one thread per rank.
Trace emulate(const TpCheckOptions& o, const std::vector<int32_t>& prompt) {
  LocalGroup group(o.tp);
  std::vector<std::unique_ptr<Model>> models;
  for (int p = 0; p < o.tp; ++p) models.push_back(load_part(o, group.rank(p), std::make_shared<TpWeights>()));
  std::vector<Trace> traces(static_cast<size_t>(o.tp));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(o.tp));
  std::vector<std::thread> threads;
  for (int p = 0; p < o.tp; ++p)
    threads.emplace_back([&, p] {
      try {
        traces[static_cast<size_t>(p)] = greedy(*models[static_cast<size_t>(p)], o, prompt, &group.rank(p));
      } catch (...) {
        errors[static_cast<size_t>(p)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return traces[0];
}

// The first step whose logits differ, or -1.
int first_difference(const Trace& a, const Trace& b, int V) {
  for (size_t s = 0; s * V < a.logits.size(); ++s)
    if (std::memcmp(a.logits.data() + s * V, b.logits.data() + s * V, sizeof(float) * V) != 0)
      return static_cast<int>(s);
  return -1;
}

void tp_check(const TpCheckOptions& o) {
  std::unique_ptr<Model> base = load_model(o.model, o.flags.options());
  const std::vector<int32_t> prompt = base->tokenizer().encode(o.prompt, base->tokenizer().add_bos_default(), false);
  if (prompt.empty()) fail("the prompt has no tokens");
  const int V = base->n_vocab();
  Trace dist;
  int rank = 0;
  if (!o.local) {
    std::unique_ptr<Model> part = load_model(o.model, o.flags.options());
    rank = apply_tensor_parallel(*part, o.tp);
    dist = greedy(*part, o, prompt, o.tp > 1 ? &mpi_world() : nullptr);
    if (rank != 0) return;
  }
  const Trace emu = emulate(o, prompt);
  const Trace ref = greedy(*base, o, prompt, nullptr);
  bool ok = true;
  if (!o.local) {
    const int d = first_difference(dist, emu, V);
    fmt::print("tp-check: {} ranks over MPI vs in-process: logits of {} steps {}\n", o.tp, o.steps + 1,
               d < 0 ? "identical bit for bit" : fmt::format("DIFFER from step {}", d));
    ok &= d < 0 && dist.tokens == emu.tokens;
  }
  double max_diff = 0, max_logit = 0;
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(emu.logits[i] - ref.logits[i])));
    max_logit = std::max(max_logit, static_cast<double>(std::fabs(ref.logits[i])));
  }
  const double rel = max_logit > 0 ? max_diff / max_logit : max_diff;
  const bool same_tokens = emu.tokens == ref.tokens;
  fmt::print("tp-check: {} ranks vs one: greedy tokens {}, max |logit difference| {:.3g} (max |logit| {:.3g}, "
             "relative {:.3g}, tolerance {:.3g})\n",
             o.tp, same_tokens ? "identical" : "DIFFER", max_diff, max_logit, rel, o.tol);
  fmt::print("tp-check: tokens {}\n", fmt::join(emu.tokens, " "));
  ok &= same_tokens && rel <= o.tol;
  if (!ok) fail("tensor-parallel check failed for {} at --tp {}", o.model, o.tp);
  fmt::print("tp-check: ok\n");
}

}  // namespace

void register_tp_check(CLI::App& app) {
  auto o = std::make_shared<TpCheckOptions>();
  auto* cmd = app.add_subcommand("tp-check",
                                 "Check tensor parallelism: run under mpirun -np N with --tp N; compares with the "
                                 "in-process run of the same partition (bit for bit) and with one process");
  add_model_flags(cmd, o->model, o->flags);
  add_tp_flag(cmd, o->tp);
  cmd->add_option("-p,--prompt", o->prompt, "Text whose tokens are fed (raw, no chat template)")->capture_default_str();
  cmd->add_option("-n,--steps", o->steps, "Greedy tokens generated")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("-t,--threads", o->threads, "Worker threads per rank")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--executor", o->executor, "mega, opbyop, serial or reference")
      ->capture_default_str()
      ->check(CLI::IsMember({"mega", "opbyop", "serial", "reference"}));
  check_finite(cmd->add_option("--tol", o->tol, "Largest |logit difference| to one process, over the largest |logit|")
                   ->capture_default_str(),
               0, true, 1);
  cmd->add_flag("--local", o->local, "Only the in-process ranks (no MPI)");
  cmd->callback([o] { run_guarded([o] { tp_check(*o); }); });
}

}  // namespace megakern::cli
