// `megakern bench-spec` (speculative against plain decoding) and
// `megakern gen-drafter`.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "runtime/model.h"
#include "spec/block_drafter.h"
#include "spec/drafter.h"
#include "spec/generator.h"
#include "spec/speculative.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"
#include "tools/spec_cli.h"

namespace megakern::cli {
namespace {

// Rows per step of the engine that measures verify costs: draft + 1 rows and
// 8 at least (the cost table's largest), and a recurrent model's prompt in
// blocks of kDefaultUbatch positions (as Generator computes it).
int engine_rows(int draft) { return std::max(kDefaultUbatch, draft + 1); }

const char* kParagraph =
    "The city council met on Tuesday evening to discuss the proposal for a new public library in the north "
    "district. Supporters argued that the nearest library is more than five kilometres away and that children in "
    "the area have no quiet place to study after school. Opponents worried about the cost, which the planning "
    "office estimates at twelve million euros, and about the loss of the small park where the building would "
    "stand. After three hours of debate the council agreed to ask the planning office for a second design that "
    "keeps part of the park, and to hold a public meeting in the district before the final vote in March.";

const char* kCode =
    "int find_max(const int* values, int n) {\n"
    "  int best = values[0];\n"
    "  for (int i = 1; i < n; ++i) {\n"
    "    if (values[i] > best) best = values[i];\n"
    "  }\n"
    "  return best;\n"
    "}\n"
    "\n"
    "double average(const int* values, int n) {\n"
    "  long sum = 0;\n"
    "  for (int i = 0; i < n; ++i) sum += values[i];\n"
    "  return n > 0 ? (double)sum / n : 0.0;\n"
    "}\n";

const char* kPython =
    "def load_scores(path):\n"
    "    scores = {}\n"
    "    with open(path) as f:\n"
    "        for line in f:\n"
    "            name, value = line.strip().split(\",\")\n"
    "            scores[name] = int(value)\n"
    "    return scores\n"
    "\n"
    "\n"
    "def best_player(scores):\n"
    "    best_name = None\n"
    "    best_value = -1\n"
    "    for name, value in scores.items():\n"
    "        if value > best_value:\n"
    "            best_name = name\n"
    "            best_value = value\n"
    "    return best_name\n";

const char* kReport =
    "Incident report, storage cluster B. At 02:14 the monitoring system reported that write latency on the "
    "cluster had risen above 800 milliseconds. The engineer on call found that one of the six storage nodes was "
    "rebuilding a failed disk and that the rebuild was using most of the node's network capacity. \"We limited "
    "the rebuild to 200 megabytes per second and latency returned to normal within ten minutes,\" she wrote in "
    "the ticket. No data was lost. The team will add an alert for rebuilds that run longer than one hour, and "
    "will review the rebuild speed limit on all clusters before the end of the month.";

const char* kEmail =
    "Hi Marta,\n\n"
    "Thanks for the quick reply. To confirm the plan: the first delivery of 40 chairs arrives on 12 May, and the "
    "second delivery of 25 tables on 19 May. The invoice for the chairs is 3,200 euros and is due on 30 May; the "
    "tables cost 4,750 euros, due on 6 June. If the tables are late, the supplier has agreed to a discount of "
    "5 percent. Our contact there is Jonas Berg, phone 030 5550 1234.\n\n"
    "Best regards,\nPaul";

std::vector<std::pair<std::string, std::string>> bench_prompts() {
  return {
      {"summarise", std::string("Summarise this text in a few sentences:\n\n") + kParagraph},
      {"rewrite", std::string("Rewrite this text in simpler words, keeping every fact:\n\n") + kParagraph},
      {"comment-code", std::string("Add comments to this code:\n\n") + kCode},
      {"rename-code", std::string("Rename the parameter `n` to `count` in this code and show the result:\n\n") +
                          kCode},
      {"edit-python", std::string("Change best_player so that it returns None for an empty dictionary, and add a "
                                  "docstring to both functions. Show the complete new code.\n\n") +
                          kPython},
      {"quote-report", std::string("Summarise this report in three sentences, quoting the engineer's words "
                                   "exactly:\n\n") +
                           kReport},
      {"extract-email", std::string("List every date and every amount of money in this email, one per line, each "
                                    "with the sentence it comes from:\n\n") +
                            kEmail},
  };
}

struct PromptSpec {
  std::string name, category, text;
};

// JSON lines of {"name", "category", "text"} (blank lines skipped).
std::vector<PromptSpec> read_prompt_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("prompt file {}: cannot read it", path);
  std::vector<PromptSpec> out;
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      fail("prompt file {} line {}: not valid JSON: {}", path, no, e.what());
    }
    PromptSpec p;
    for (auto [key, dst] : {std::pair{"name", &p.name}, {"category", &p.category}, {"text", &p.text}}) {
      if (!j.is_object() || !j.contains(key) || !j.at(key).is_string())
        fail("prompt file {} line {}: needs a string field '{}'", path, no, key);
      *dst = j.at(key).get<std::string>();
    }
    if (p.text.empty()) fail("prompt file {} line {}: the text is empty", path, no);
    out.push_back(std::move(p));
  }
  if (out.empty()) fail("prompt file {}: no prompts", path);
  return out;
}

std::vector<int32_t> encode_prompt(const Model& m, const std::string& text) {
  const Tokenizer& tok = m.tokenizer();
  if (m.declares_chat_template() && m.chat_format().kind != ChatTemplate::None) {
    const std::string chat = render_chat(m.chat_format(), {{"user", text}}, /*add_generation_prompt=*/true);
    return tok.encode(chat, tok.add_bos_default(), /*parse_special=*/true);
  }
  return tok.encode(text, tok.add_bos_default(), /*parse_special=*/false);
}

// Median ms of one step of `rows` rows of one sequence at positions pos..
double time_verify(Engine& eng, SequenceState& seq, int rows, int pos, int reps) {
  std::vector<RowInput> in;
  // Recurrent rows chain through their own state snapshots, as in a verify.
  std::vector<RecurrentState> snaps(seq.recurrent ? static_cast<size_t>(rows) : 0, seq.state);
  for (int r = 0; r < rows; ++r) {
    RowInput row = seq.row(static_cast<int32_t>((r * 31 + 7) % eng.n_vocab()), pos + r);
    if (seq.recurrent) {
      row.state = &snaps[static_cast<size_t>(r)];
      row.state_in = r == 0 ? &seq.state : in.back().state;
    }
    in.push_back(row);
  }
  std::vector<float> logits(static_cast<size_t>(rows) * static_cast<size_t>(eng.n_vocab()));
  eng.executor().prepare(rows);
  eng.step(in, logits.data());  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    eng.step(in, logits.data());
    t.push_back(ms_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

void add_spec_bench_options(CLI::App* cmd, SpecBenchOptions& o, bool with_spec_flag) {
  if (with_spec_flag)
    check_drafters(cmd->add_option("--spec", o.drafters,
                                   "Benchmark speculative decoding instead, with these comma-separated drafters (ngram, ngram:N, "
                                   "self, self:skip=A-B, self:N, model:PATH)"));
  cmd->add_option("--draft", o.draft, "Speculative: most draft tokens per verify step")
      ->capture_default_str()
      ->check(CLI::Range(1, SpecOptions::kMaxDraft));
  cmd->add_flag("--fixed-draft", o.fixed, "Speculative: always propose --draft tokens (no adaptive length)");
  cmd->add_option("-n,--n-predict", o.n_predict, "Speculative: tokens generated per prompt")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--reps", o.reps, "Speculative: runs per prompt and method (the fastest is kept)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_option("--verify-reps", o.verify_reps, "Speculative: timed steps per verify-cost point")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
}

void spec_bench_cmd(const SpecBenchOptions& o) {
  const auto t_load = Clock::now();
  ModelOptions mo;
  mo.numerics = parse_numerics(o.numerics);
  mo.kv_type = parse_kv_type(o.kv_type);
  auto model = load_model(o.model, mo);
  ThreadPool pool(o.threads);
  fmt::print("model {} | {} | load {:.0f} ms | {} threads\n", model->name(), model->description(), ms_since(t_load),
             pool.size());
  struct PromptRun {
    std::string name, category;
    std::vector<int32_t> prompt, plain;
    double plain_ms = 1e300;
  };
  std::vector<PromptSpec> specs_in;
  if (o.prompts.empty())
    for (const auto& [name, text] : bench_prompts()) specs_in.push_back({name, "input-grounded", text});
  else
    specs_in = read_prompt_file(o.prompts);
  std::vector<PromptRun> runs;
  int n_ctx = 0;
  for (const auto& [name, category, text] : specs_in) {
    PromptRun r;
    r.name = name;
    r.category = category;
    r.prompt = encode_prompt(*model, text);
    n_ctx = std::max<int>(n_ctx, static_cast<int>(r.prompt.size()) + o.n_predict + SpecOptions::kMaxDraft + 2);
    runs.push_back(std::move(r));
  }

  // The speculative generators, one per drafter, built before anything is
  // timed.
  struct SpecRun {
    std::unique_ptr<Generator> gen;
    std::vector<double> ms;           // per prompt, best of reps
    std::vector<SpecStats> stats;     // of that best run
    std::vector<std::vector<int32_t>> out;
  };
  GeneratorOptions go;
  go.n_ctx = n_ctx;
  go.draft = o.draft;
  go.fixed_draft = o.fixed;
  std::vector<SpecRun> specs;
  for (const std::string& spec : split_list(o.drafters)) {
    SpecRun s;
    go.drafter = spec;
    s.gen = std::make_unique<Generator>(*model, pool, go);
    s.ms.assign(runs.size(), 1e300);
    s.stats.resize(runs.size());
    s.out.resize(runs.size());
    specs.push_back(std::move(s));
  }

  // Plain and speculative decoding of each prompt are interleaved, rep by
  // rep, so slow drift in the machine's speed affects all methods alike; each
  // keeps its fastest run (the one least disturbed by other work). Greedy,
  // to o.n_predict tokens or an end-of-generation token.
  go.drafter.clear();
  Generator plain(*model, pool, go);
  GenerationParams gp;
  gp.max_tokens = o.n_predict;
  for (int rep = 0; rep < o.reps; ++rep)
    for (size_t k = 0; k < runs.size(); ++k) {
      PromptRun& r = runs[k];
      plain.reset();
      GenResult res = plain.generate(r.prompt, gp);
      r.plain = std::move(res.tokens);
      r.plain_ms = std::min(r.plain_ms, res.decode_ms);
      for (auto& sr : specs) {
        sr.gen->reset_spec_stats();
        res = sr.gen->generate(r.prompt, gp);
        if (res.decode_ms < sr.ms[k]) {
          sr.ms[k] = res.decode_ms;
          sr.stats[k] = *sr.gen->spec_stats();
        }
        sr.out[k] = std::move(res.tokens);
      }
    }
  int64_t plain_tokens = 0;
  double plain_ms = 0;
  for (const auto& r : runs) {
    plain_tokens += static_cast<int64_t>(r.plain.size());
    plain_ms += r.plain_ms;
  }
  const double plain_tps = plain_ms > 0 ? plain_tokens * 1000.0 / plain_ms : 0;
  if (o.prompts.empty())
    fmt::print("prompts: {} input-grounded (summarise, rewrite, comment code, rename in code, edit code, summarise with "
               "quotes, extract), {} tokens each at most, "
               "greedy, best of {} runs each (plain and speculative runs interleaved)\n",
               runs.size(), o.n_predict, o.reps);
  else
    fmt::print("prompts: {} from {}, {} tokens each at most, greedy, best of {} runs each (plain and speculative runs "
               "interleaved)\n",
               runs.size(), o.prompts, o.n_predict, o.reps);
  fmt::print("plain decode: {} tokens in {:.0f} ms, {:.2f} tok/s\n", plain_tokens, plain_ms, plain_tps);

  // Verify cost: one step of r rows of one sequence against one row.
  nlohmann::json j;
  j["model"] = model->name();
  j["threads"] = pool.size();
  j["plain_tokens_per_s"] = plain_tps;
  std::vector<double> row_ms;  // [rows]: the median time of a verify step of that many rows
  {
    Engine eng(*model, pool, engine_rows(o.draft));
    SequenceState seq = model->new_sequence(n_ctx);
    std::vector<float> logits(static_cast<size_t>(model->n_vocab()));
    const auto& p = runs[0].prompt;
    eng.prefill(seq, p.data(), static_cast<int>(p.size()), 0, logits.data());
    std::vector<int> sizes = {1};
    for (int r : {2, 4, 8, o.draft + 1})
      if (r <= eng.max_rows() && std::find(sizes.begin(), sizes.end(), r) == sizes.end()) sizes.push_back(r);
    const double one = time_verify(eng, seq, 1, static_cast<int>(p.size()), o.verify_reps);
    // Every row count a round may verify, for the modelled speedups below.
    row_ms.assign(static_cast<size_t>(o.draft) + 2, 0.0);
    row_ms[1] = one;
    for (int r = 2; r <= o.draft + 1; ++r) row_ms[static_cast<size_t>(r)] = time_verify(eng, seq, r, static_cast<int>(p.size()), o.verify_reps);
    std::string line = fmt::format("verify step cost at position {}: 1 row {:.2f} ms", p.size(), one);
    for (size_t i = 1; i < sizes.size(); ++i) {
      const double ms = time_verify(eng, seq, sizes[i], static_cast<int>(p.size()), o.verify_reps);
      line += fmt::format(" | {} rows {:.2f} ms ({:.2f}x)", sizes[i], ms, ms / one);
      j["verify_cost"][std::to_string(sizes[i])] = ms / one;
    }
    if (model->recurrent()) line += " (recurrent rows chained through per-row state snapshots)";
    fmt::print("{}\n", line);
  }

  fmt::print("verify steps of 1..{} rows (ms):", o.draft + 1);
  for (size_t r = 1; r < row_ms.size(); ++r) fmt::print(" {:.2f}", row_ms[r]);
  fmt::print("\n");
  fmt::print("{:<28} {:>11} {:>10} {:>8} {:>11} {:>10} {:>10}\n", "drafter", "plain tok/s", "spec tok/s", "speedup",
             "accept len", "accepted", "identical");
  // Modelled speedup: the plain steps a prompt's tokens take against the
  // verify steps its rounds took, each at the step time measured above for
  // its row count; it depends on the acceptance and the cost table only, not
  // on how busy the machine was during each run.
  auto modelled = [&](const SpecStats& st, size_t n_tokens) {
    double spec = 0;
    for (size_t r = 1; r < st.rounds_by_rows.size() && r < row_ms.size(); ++r) spec += st.rounds_by_rows[r] * row_ms[r];
    return spec > 0 && n_tokens > 1 ? (n_tokens - 1) * row_ms[1] / spec : 0.0;
  };
  for (const auto& sr : specs) {
    SpecStats total;
    int64_t model_plain_steps = 0;
    nlohmann::json rows_json = nlohmann::json::array();
    double model_spec_ms = 0;
    int64_t tokens = 0;
    double ms = 0;
    bool identical = true;
    std::string per_prompt;
    nlohmann::json prompts_json = nlohmann::json::array();
    // Per category: tokens, plain and speculative ms, rounds, emitted.
    struct Cat {
      int64_t tokens = 0, plain_tokens = 0, rounds = 0, emitted = 0;
      double ms = 0, plain_ms = 0;
    };
    std::vector<std::pair<std::string, Cat>> cats;
    for (size_t k = 0; k < runs.size(); ++k) {
      const PromptRun& r = runs[k];
      const auto& out = sr.out[k];
      const SpecStats& st = sr.stats[k];
      const double dms = sr.ms[k];
      identical = identical && out == r.plain;
      tokens += static_cast<int64_t>(out.size());
      ms += dms;
      total.rounds += st.rounds;
      total.proposed += st.proposed;
      total.accepted += st.accepted;
      total.emitted += st.emitted;
      if (out.size() > 1) model_plain_steps += static_cast<int64_t>(out.size()) - 1;
      {
        auto it = std::find_if(cats.begin(), cats.end(), [&](const auto& c) { return c.first == r.category; });
        if (it == cats.end()) it = cats.insert(cats.end(), {r.category, Cat{}});
        Cat& c = it->second;
        c.tokens += static_cast<int64_t>(out.size());
        c.plain_tokens += static_cast<int64_t>(r.plain.size());
        c.ms += dms;
        c.plain_ms += r.plain_ms;
        c.rounds += st.rounds;
        c.emitted += st.emitted;
      }
      for (size_t r = 1; r < st.rounds_by_rows.size() && r < row_ms.size(); ++r)
        model_spec_ms += st.rounds_by_rows[r] * row_ms[r];
      per_prompt += fmt::format("    {:<14} modelled speedup {:.2f}x\n", r.name, modelled(st, out.size()));
      {
        nlohmann::json rj;
        rj["prompt"] = r.name;
        rj["tokens"] = out.size();
        rj["rounds_by_rows"] = std::vector<int64_t>(st.rounds_by_rows.begin(), st.rounds_by_rows.end());
        rj["modelled_speedup"] = modelled(st, out.size());
        rows_json.push_back(rj);
      }
      per_prompt += fmt::format(
          "    {:<14} {:>4} tokens  plain {:7.2f} tok/s  spec {:7.2f} tok/s  {:.2f}x  accept len {:.2f}  rounds {} "
          "({} plain)  verified {} accepted {}  draft {:.1f} ms verify {:.1f} ms{}\n",
          r.name, out.size(), r.plain.size() * 1000.0 / r.plain_ms, out.size() * 1000.0 / dms,
          (out.size() / dms) / (r.plain.size() / r.plain_ms), st.mean_accept(), st.rounds, st.plain_rounds,
          st.proposed, st.accepted, st.draft_ms, st.verify_ms, out == r.plain ? "" : "  OUTPUT DIFFERS");
      nlohmann::json pj;
      pj["prompt"] = r.name;
      pj["category"] = r.category;
      pj["tokens"] = out.size();
      pj["plain_tokens_per_s"] = r.plain.size() * 1000.0 / r.plain_ms;
      pj["spec_tokens_per_s"] = out.size() * 1000.0 / dms;
      pj["speedup"] = (out.size() / dms) / (r.plain.size() / r.plain_ms);
      pj["acceptance_length"] = st.mean_accept();
      pj["rounds"] = st.rounds;
      pj["plain_rounds"] = st.plain_rounds;
      pj["verified"] = st.proposed;
      pj["accepted"] = st.accepted;
      pj["draft_ms"] = st.draft_ms;
      pj["verify_ms"] = st.verify_ms;
      pj["identical"] = out == r.plain;
      prompts_json.push_back(pj);
    }
    const double tps = ms > 0 ? tokens * 1000.0 / ms : 0;
    fmt::print("{:<28} {:>11.2f} {:>10.2f} {:>7.2f}x {:>11.2f} {:>9.0f}% {:>10}\n", sr.gen->drafter()->name(), plain_tps, tps,
               plain_tps > 0 ? tps / plain_tps : 0.0, total.mean_accept(), 100.0 * total.acceptance_rate(),
               identical ? "yes" : "NO");
    fmt::print("{}", per_prompt);
    nlohmann::json cats_json = nlohmann::json::object();
    for (const auto& [name, c] : cats) {
      const double ptps = c.plain_ms > 0 ? c.plain_tokens * 1000.0 / c.plain_ms : 0;
      const double stps = c.ms > 0 ? c.tokens * 1000.0 / c.ms : 0;
      const double acc = c.rounds > 0 ? static_cast<double>(c.emitted) / static_cast<double>(c.rounds) : 0;
      fmt::print("    category {:<16} plain {:7.2f} tok/s  spec {:7.2f} tok/s  {:.2f}x  accept len {:.2f}\n", name, ptps,
                 stps, ptps > 0 ? stps / ptps : 0.0, acc);
      cats_json[name] = {{"plain_tokens_per_s", ptps}, {"spec_tokens_per_s", stps},
                         {"speedup", ptps > 0 ? stps / ptps : 0.0}, {"acceptance_length", acc}};
    }
    fmt::print("    modelled speedup, all prompts: {:.2f}x\n",
               model_spec_ms > 0 ? model_plain_steps * row_ms[1] / model_spec_ms : 0.0);
    nlohmann::json d;
    d["drafter"] = sr.gen->drafter()->name();
    d["tokens_per_s"] = tps;
    d["speedup"] = plain_tps > 0 ? tps / plain_tps : 0.0;
    d["acceptance_length"] = total.mean_accept();
    d["acceptance_rate"] = total.acceptance_rate();
    d["identical"] = identical;
    d["prompts"] = prompts_json;
    d["categories"] = cats_json;
    d["rounds"] = rows_json;
    d["verify_ms_by_rows"] = row_ms;
    j["drafters"].push_back(d);
    if (!identical) fail("drafter {}: speculative output differs from plain decoding", sr.gen->drafter()->name());
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    if (!f) fail("--json: cannot write '{}'", o.json);
    f << j.dump(2) << "\n";
  }
}

void register_bench_spec(CLI::App& app) {
  auto o = std::make_shared<SpecBenchOptions>();
  auto* cmd = app.add_subcommand(
      "bench-spec", "Speculative decoding benchmark: plain vs speculative tokens/s, acceptance length, verify cost");
  check_non_empty(cmd->add_option("-m,--model", o->model, "Target model (a fetched model, preset or path)")->capture_default_str());
  add_numerics_flag(cmd, o->numerics);
  add_kv_type_flag(cmd, o->kv_type);
  check_drafters(cmd->add_option("--spec,--drafters", o->drafters,
                                 "Comma-separated drafters: ngram, ngram:N, self, self:skip=A-B, self:N, model:PATH, dspark[:PATH], "
                                 "dflash[:PATH] (without a path dspark loads the trained drafter shipped for SmolLM2; otherwise "
                                 "random MINI weights: acceptance near zero)"))
      ->capture_default_str();
  add_spec_bench_options(cmd, *o, false);
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0: one per core)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  check_output_file(cmd->add_option("--json", o->json, "Also write the results to this JSON file"));
  cmd->add_option("--prompts", o->prompts,
                  "JSON lines {\"name\", \"category\", \"text\"} to run instead of the built-in input-grounded prompts "
                  "(results also per category)");
  cmd->callback([o] { run_guarded([&] { spec_bench_cmd(*o); }); });
}

void register_gen_drafter(CLI::App& app) {
  struct Opts {
    std::string model = "dense-mini";
    std::string kind = "dspark";
    std::string out;
    uint64_t seed = 1;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "gen-drafter",
      "Write synthetic block-drafter weights (dspark or dflash, MINI size) for a target model: a directory with "
      "config.json and model.safetensors, for --spec dspark:DIR / dflash:DIR. The weights are random, so drafts are "
      "rarely accepted");
  check_non_empty(cmd->add_option("-m,--model", o->model, "Target model (a fetched model, preset or path)")->capture_default_str());
  cmd->add_option("--kind", o->kind, "dspark or dflash")->capture_default_str()->check(CLI::IsMember({"dspark", "dflash"}));
  cmd->add_option("-o,--out", o->out, "Output directory")->required();
  check_seed(cmd->add_option("--seed", o->seed, "Seed of the random weights")->capture_default_str());
  cmd->callback([o] {
    run_guarded([&] {
      auto model = load_model(o->model);
      BlockDrafterConfig c =
          BlockDrafterConfig::mini(o->kind == "dspark" ? BlockDrafterKind::DSpark : BlockDrafterKind::DFlash, *model);
      c.seed = o->seed;
      save_block_drafter(synthetic_block_drafter(c), o->out);
      std::string taps;
      for (int l : c.tap_layers) taps += (taps.empty() ? "" : ",") + std::to_string(l);
      fmt::print("wrote {} drafter for {} to {}: hidden {}, {} layers, block {}, taps after layers {}{}\n", o->kind,
                 model->name(), o->out, c.hidden, c.n_layer, c.block, taps,
                 c.markov_rank ? fmt::format(", Markov rank {}", c.markov_rank) : std::string());
    });
  });
}

void register_gen_drafter_data(CLI::App& app) {
  struct Opts {
    std::string model = "smollm2-135m";
    std::string numerics = "exact";
    std::string prompts, out, taps;
    int n_predict = 256;
    int threads = 0;
    float temperature = 0.f;
    uint64_t seed = 1;
    bool check_taps = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "gen-drafter-data",
      "Training data for a block drafter: the target's own answers to a prompt file (greedy, or sampled with "
      "--temperature) and the target's residual-stream taps at every position of prompt and answer, computed as "
      "speculative decoding feeds them to the drafter");
  check_non_empty(cmd->add_option("-m,--model", o->model, "Target model (a fetched model, preset or path)")->capture_default_str());
  add_numerics_flag(cmd, o->numerics);
  cmd->add_option("--prompts", o->prompts, "JSON lines {\"name\", \"category\", \"text\"}")->required();
  cmd->add_option("-o,--out", o->out, "Output file (binary: a header, then per sequence its length, prompt length, int32 tokens and f32 taps; a .jsonl of the answers is written beside it)")->required();
  cmd->add_option("--taps", o->taps, "Comma-separated target layers to tap after (the stream entering the next)")
      ->required();
  cmd->add_option("-n,--n-predict", o->n_predict, "Most tokens per answer")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")->capture_default_str()->check(CLI::Range(0.0, 10.0));
  check_seed(cmd->add_option("--seed", o->seed, "Sampling seed")->capture_default_str());
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0: one per core)")->capture_default_str()->check(CLI::Range(0, 1024));
  cmd->add_flag("--check-taps", o->check_taps,
                "Also compute the first answer's taps one position per step (as verify rows) and report the largest "
                "difference from the prompt-pass taps written");
  cmd->callback([o] {
    run_guarded([&] {
      const auto t0 = Clock::now();
      ModelOptions mo;
      mo.numerics = parse_numerics(o->numerics);
      auto model = load_model(o->model, mo);
      ThreadPool pool(o->threads);
      std::vector<int> layers;
      for (const std::string& t : split_list(o->taps)) {
        int v = -1;
        const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (ec != std::errc() || ptr != t.data() + t.size() || v < 0)
          fail("--taps: '{}' is not a layer number", t);
        layers.push_back(v);
      }
      if (layers.empty()) fail("--taps: no layers");
      const std::vector<PromptSpec> prompts = read_prompt_file(o->prompts);
      std::vector<std::vector<int32_t>> encoded;
      int n_ctx = 0;
      for (const auto& p : prompts) {
        encoded.push_back(encode_prompt(*model, p.text));
        n_ctx = std::max<int>(n_ctx, static_cast<int>(encoded.back().size()) + o->n_predict + 1);
      }
      GeneratorOptions go;
      go.n_ctx = n_ctx;
      go.sampling.temperature = o->temperature;
      go.sampling.seed = o->seed;
      Generator gen(*model, pool, go);
      Engine eng(*model, pool, kDefaultUbatch);
      eng.enable_taps(layers);
      const int W = eng.tap_width();
      std::ofstream out(o->out, std::ios::binary);
      if (!out) fail("--out: cannot write '{}'", o->out);
      std::ofstream side(o->out + ".jsonl");
      if (!side) fail("--out: cannot write '{}.jsonl'", o->out);
      auto put = [&](const void* p, size_t n) { out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n)); };
      auto put_i32 = [&](int32_t v) { put(&v, 4); };
      put("MKTAPS01", 8);
      put_i32(W);
      put_i32(static_cast<int32_t>(layers.size()));
      for (int l : layers) put_i32(l);
      put_i32(static_cast<int32_t>(model->n_vocab()));
      GenerationParams gp;
      gp.max_tokens = o->n_predict;
      int64_t n_tokens = 0;
      double gen_ms = 0, tap_ms = 0;
      std::vector<float> logits(static_cast<size_t>(model->n_vocab())), taps;
      for (size_t i = 0; i < prompts.size(); ++i) {
        gen.reset();
        const auto tg = Clock::now();
        const GenResult r = gen.generate(encoded[i], gp);
        gen_ms += ms_since(tg);
        std::vector<int32_t> seq_tokens = encoded[i];
        seq_tokens.insert(seq_tokens.end(), r.tokens.begin(), r.tokens.end());
        const int n = static_cast<int>(seq_tokens.size());
        const auto tt = Clock::now();
        SequenceState seq = model->new_sequence(n_ctx);
        taps.resize(static_cast<size_t>(n) * static_cast<size_t>(W));
        eng.prefill(seq, seq_tokens.data(), n, 0, logits.data(), taps.data());
        tap_ms += ms_since(tt);
        if (o->check_taps && i == 0) {
          // The same positions one row per step, as verify rows compute them.
          SequenceState one = model->new_sequence(n_ctx);
          std::vector<float> row_taps(static_cast<size_t>(W));
          double worst = 0, scale = 0;
          for (int pos = 0; pos < n; ++pos) {
            eng.step({one.row(seq_tokens[static_cast<size_t>(pos)], pos)}, logits.data(), row_taps.data());
            for (int c = 0; c < W; ++c) {
              const float a = taps[static_cast<size_t>(pos) * static_cast<size_t>(W) + static_cast<size_t>(c)];
              worst = std::max(worst, static_cast<double>(std::fabs(a - row_taps[static_cast<size_t>(c)])));
              scale = std::max(scale, static_cast<double>(std::fabs(a)));
            }
          }
          fmt::print("tap check: {} positions of '{}', one row per step against the prompt pass: largest difference "
                     "{:.3g} (largest tap value {:.3g})\n",
                     n, prompts[i].name, worst, scale);
        }
        put_i32(n);
        put_i32(static_cast<int32_t>(encoded[i].size()));
        put(seq_tokens.data(), seq_tokens.size() * 4);
        put(taps.data(), taps.size() * 4);
        nlohmann::json j;
        j["name"] = prompts[i].name;
        j["category"] = prompts[i].category;
        j["prompt_tokens"] = encoded[i].size();
        j["answer_tokens"] = r.tokens.size();
        j["answer"] = r.text;
        side << j.dump() << "\n";
        n_tokens += static_cast<int64_t>(r.tokens.size());
        if ((i + 1) % 25 == 0 || i + 1 == prompts.size())
          fmt::print("{}/{} prompts, {} answer tokens, {:.1f} tok/s generating, taps {:.1f} s\n", i + 1, prompts.size(),
                     n_tokens, gen_ms > 0 ? n_tokens * 1000.0 / gen_ms : 0.0, tap_ms / 1000.0);
        std::fflush(stdout);
      }
      out.close();
      if (!out) fail("--out: writing '{}' failed", o->out);
      fmt::print("wrote {} sequences ({} answer tokens, taps of width {}) to {} in {:.1f} s\n", prompts.size(), n_tokens, W,
                 o->out, ms_since(t0) / 1000.0);
    });
  });
}

}  // namespace megakern::cli
