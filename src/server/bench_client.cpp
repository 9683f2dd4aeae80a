#include "server/bench_client.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megakern::server {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// One streamed request: events are split at blank lines as they arrive, the
// first one with text marks the first token, the usage chunk gives the count.
// `messages`: the chat history to send (chat), else the prompt is sent.
BenchRequest one_request(httplib::Client& cli, const BenchOptions& o, const json& messages) {
  json body = {{"max_tokens", o.output_len}, {"temperature", 0},
               {"stream", true},            {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", true}};
  if (!o.model.empty()) body["model"] = o.model;
  if (o.chat)
    body["messages"] = messages;
  else
    body["prompt"] = o.prompt;

  httplib::Request req;
  req.method = "POST";
  req.path = o.chat ? "/v1/chat/completions" : "/v1/completions";
  req.headers.emplace("Content-Type", "application/json");
  if (!o.api_key.empty()) req.headers.emplace("Authorization", "Bearer " + o.api_key);
  req.body = body.dump();

  BenchRequest r;
  std::string buf;
  bool got_first = false, done = false;
  Clock::time_point t_first, t_last;
  const auto t0 = Clock::now();
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buf.append(data, len);
    size_t end;
    while ((end = buf.find("\n\n")) != std::string::npos) {
      const std::string event = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;  // comments and other fields
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) r.error = j["error"].value("message", "error event");
      if (j.contains("usage") && j["usage"].is_object()) {
        const json& u = j["usage"];
        r.output_tokens = u.value("completion_tokens", 0);
        r.prompt_tokens = u.value("prompt_tokens", 0);
        if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
          r.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", 0);
      }
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const json& c = j["choices"][0];
      std::string text;
      if (c.contains("text") && c["text"].is_string()) text = c["text"];
      if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string())
        text = c["delta"]["content"];
      if (text.empty()) continue;
      r.text += text;
      const auto now = Clock::now();
      if (!got_first) {
        got_first = true;
        t_first = now;
      }
      t_last = now;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(req, res, err);
  r.total_ms = ms_between(t0, Clock::now());
  if (!sent) {
    r.error = fmt::format("request failed: {}", httplib::to_string(err));
  } else if (res.status != 200) {
    r.error = fmt::format("HTTP {}: {}", res.status, res.body.empty() ? buf : res.body);
  } else if (!done && r.error.empty()) {
    r.error = "the stream ended without [DONE]";
  }
  if (!r.error.empty()) return r;
  r.ok = true;
  if (got_first) {
    r.ttft_ms = ms_between(t0, t_first);
    if (r.output_tokens > 1) r.tpot_ms = ms_between(t_first, t_last) / (r.output_tokens - 1);
  }
  return r;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // Nearest rank.
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

}  // namespace

BenchSummary run_bench(const BenchOptions& o) {
  if (o.concurrency < 1) fail("--concurrency must be at least 1, got {}", o.concurrency);
  if (o.requests < 1) fail("--requests must be at least 1, got {}", o.requests);
  if (o.output_len < 1) fail("--output-len must be at least 1, got {}", o.output_len);
  if (o.turns < 1) fail("--turns must be at least 1, got {}", o.turns);
  if (o.turns > 1 && !o.chat) fail("--turns {} needs --chat (a conversation is a chat)", o.turns);
  if (o.url.rfind("http://", 0) != 0 && o.url.rfind("https://", 0) != 0)
    fail("--url must start with http:// or https://, got '{}'", o.url);
  {
    httplib::Client probe(o.url);
    if (!probe.is_valid()) fail("--url '{}' is not a URL this client can use", o.url);
  }
  BenchSummary s;
  s.requests.resize(static_cast<size_t>(o.requests) * static_cast<size_t>(o.turns));
  std::atomic<int> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < std::min(o.concurrency, o.requests); ++w) {
    workers.emplace_back([&] {
      httplib::Client cli(o.url);
      cli.set_read_timeout(o.timeout_s, 0);
      cli.set_write_timeout(o.timeout_s, 0);
      cli.set_keep_alive(true);
      // Conversation i's turns are requests i * turns ... in order; a
      // failed turn ends its conversation (the later ones stay not ok).
      for (int i; (i = next.fetch_add(1)) < o.requests;) {
        json messages = json::array({{{"role", "user"}, {"content", o.prompt}}});
        for (int t = 0; t < o.turns; ++t) {
          BenchRequest& r = s.requests[static_cast<size_t>(i) * static_cast<size_t>(o.turns) + static_cast<size_t>(t)];
          r = one_request(cli, o, messages);
          r.turn = t;
          if (!r.ok) break;
          messages.push_back({{"role", "assistant"}, {"content", r.text}});
          messages.push_back({{"role", "user"}, {"content", o.follow_up}});
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  s.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> ttft, tpot, first_ttft, later_ttft;
  double later_prompt = 0, later_cached = 0;
  for (const auto& r : s.requests) {
    if (!r.ok) {
      ++s.failed;
      if (s.first_error.empty()) s.first_error = r.error.empty() ? "an earlier turn of its conversation failed" : r.error;
      continue;
    }
    ++s.ok;
    s.output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_ms);
    if (r.output_tokens > 1) tpot.push_back(r.tpot_ms);
    if (r.turn == 0) {
      first_ttft.push_back(r.ttft_ms);
    } else {
      later_ttft.push_back(r.ttft_ms);
      later_prompt += r.prompt_tokens;
      later_cached += r.cached_tokens;
    }
  }
  s.first_ttft_mean = mean(first_ttft);
  s.first_ttft_p50 = percentile(first_ttft, 50);
  s.later_ttft_mean = mean(later_ttft);
  s.later_ttft_p50 = percentile(later_ttft, 50);
  if (!later_ttft.empty()) {
    s.later_prompt_tokens = later_prompt / static_cast<double>(later_ttft.size());
    s.later_cached_tokens = later_cached / static_cast<double>(later_ttft.size());
  }
  s.ttft_mean = mean(ttft);
  s.ttft_p50 = percentile(ttft, 50);
  s.ttft_p90 = percentile(ttft, 90);
  s.tpot_mean = mean(tpot);
  s.tpot_p50 = percentile(tpot, 50);
  s.tpot_p90 = percentile(tpot, 90);
  s.tokens_per_s = s.wall_s > 0 ? s.output_tokens / s.wall_s : 0;
  return s;
}

std::string format_summary(const BenchOptions& o, const BenchSummary& s) {
  std::string out = fmt::format("bench-serve {} | {} requests | concurrency {} | output {} tokens | {}\n", o.url,
                                o.requests, o.concurrency, o.output_len, o.chat ? "chat" : "completions");
  if (o.turns > 1) out += fmt::format("conversations of {} turns (each a request)\n", o.turns);
  out += fmt::format("requests: {} ok, {} failed in {:.2f} s ({:.2f} req/s)\n", s.ok, s.failed, s.wall_s,
                     s.wall_s > 0 ? s.ok / s.wall_s : 0.0);
  out += fmt::format("TTFT ms: mean {:.1f}  p50 {:.1f}  p90 {:.1f}\n", s.ttft_mean, s.ttft_p50, s.ttft_p90);
  if (o.turns > 1) {
    out += fmt::format("TTFT ms, first turns: mean {:.1f}  p50 {:.1f}\n", s.first_ttft_mean, s.first_ttft_p50);
    out += fmt::format("TTFT ms, later turns: mean {:.1f}  p50 {:.1f}  (prompt {:.1f} tokens, of them cached {:.1f})\n",
                       s.later_ttft_mean, s.later_ttft_p50, s.later_prompt_tokens, s.later_cached_tokens);
  }
  out += fmt::format("TPOT ms: mean {:.2f}  p50 {:.2f}  p90 {:.2f}\n", s.tpot_mean, s.tpot_p50, s.tpot_p90);
  out += fmt::format("output: {} tokens, {:.1f} tokens/s aggregate\n", s.output_tokens, s.tokens_per_s);
  if (!s.first_error.empty()) out += fmt::format("first error: {}\n", s.first_error);
  return out;
}

}  // namespace megakern::server
