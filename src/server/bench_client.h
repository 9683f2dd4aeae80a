// A streaming load generator for an OpenAI-compatible server: `concurrency`
// clients issue `requests` streamed completions between them, and the time
// to first token, time per output token and aggregate throughput are measured
// from the server-sent events as they arrive. With `turns` > 1 (chat) each
// request is a conversation: turn t sends the whole history (the prompt, each
// answer as received and a follow-up message after it), as a chat client
// does, so a server that keeps computed prefixes (prefix caching) answers the
// later turns sooner; their time to first token and the prompt tokens the
// server reports as cached are summarised apart from the first turns'.
#pragma once

#include <string>
#include <vector>

namespace megakern::server {

struct BenchOptions {
  std::string url = "http://127.0.0.1:8080";
  int concurrency = 1;
  int requests = 8;
  int output_len = 64;  // max_tokens, with ignore_eos so every request generates that many
  std::string prompt = "The history of the city of Paris begins";
  std::string api_key;
  std::string model;  // "model" field; empty leaves it out
  bool chat = false;  // /v1/chat/completions instead of /v1/completions
  int turns = 1;      // chat turns per conversation (each a request); > 1 needs chat
  std::string follow_up = "Please go on.";  // the user message of every turn after the first
  int timeout_s = 600;
};

struct BenchRequest {
  bool ok = false;
  std::string error;
  double ttft_ms = 0;   // request sent -> first text
  double tpot_ms = 0;   // (last text - first text) / (tokens - 1); 0 with fewer than 2 tokens
  double total_ms = 0;
  int output_tokens = 0;  // from the usage the stream reports
  int prompt_tokens = 0;  // from the usage, likewise
  int cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens (0 when absent)
  int turn = 0;           // 0-based turn of its conversation
  std::string text;       // the text received
};

struct BenchSummary {
  std::vector<BenchRequest> requests;
  double wall_s = 0;
  int ok = 0;
  int failed = 0;
  int output_tokens = 0;
  double ttft_mean = 0, ttft_p50 = 0, ttft_p90 = 0;  // ms, over successful requests
  double tpot_mean = 0, tpot_p50 = 0, tpot_p90 = 0;  // ms
  double tokens_per_s = 0;                           // output tokens of all requests / wall time
  // With turns > 1: the same over first turns and over later turns, and the
  // later turns' mean prompt and cached tokens.
  double first_ttft_mean = 0, first_ttft_p50 = 0, later_ttft_mean = 0, later_ttft_p50 = 0;
  double later_prompt_tokens = 0, later_cached_tokens = 0;
  std::string first_error;
};

// Runs the benchmark; throws megakern::Error for bad options or a URL it
// cannot use. Failed requests are counted, not thrown.
BenchSummary run_bench(const BenchOptions& opts);

// The summary as printed by `megakern bench-serve`.
std::string format_summary(const BenchOptions& opts, const BenchSummary& s);

}  // namespace megakern::server
