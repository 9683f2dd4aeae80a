// The OpenAI-compatible request and response formats: parsing and validating
// request bodies into generation requests, and building response bodies and
// server-sent events. No I/O happens here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/logprobs.h"
#include "runtime/sampler.h"

namespace megakern {
class Model;
class Tokenizer;
struct ChatFormat;
}

namespace megakern::server {

using nlohmann::json;

// A request the server refuses: the HTTP status and the fields of OpenAI's
// error object ({"error": {"message", "type", "param", "code"}}). `param`
// names the offending request field, or is empty.
class ApiError : public Error {
 public:
  ApiError(int status, const std::string& message, std::string type = "invalid_request_error", std::string param = "",
           std::string code = "")
      : Error(message), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string type, param, code;
};

// HTTP 400 naming the request field at fault.
template <typename... Args>
[[noreturn]] void bad_param(const std::string& param, fmt::format_string<Args...> f, Args&&... args) {
  throw ApiError(400, fmt::format(f, std::forward<Args>(args)...), "invalid_request_error", param);
}

// {"error": {...}} with null for an empty param or code.
json error_body(const std::string& message, const std::string& type, const std::string& param = "",
                const std::string& code = "");
json error_body(const ApiError& e);

// Serialises for the wire. Generated text may hold bytes that are not valid
// UTF-8 (a model is free to emit them); they become U+FFFD instead of making
// the serialisation throw.
std::string dump_json(const json& j);

// The request body as a JSON object; HTTP 400 when it is not one.
json parse_json_object(const std::string& body);

enum class Endpoint { Completions, ChatCompletions };

// Why a generation ended, as OpenAI's finish_reason spells it where it has a
// spelling: "stop" (end-of-generation token or a stop string) or "length"
// (max_tokens or the context). Cancelled requests (client gone, server
// stopping) and internal errors have no successful response.
enum class FinishReason { Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);

// What the server was started with, as far as request validation needs it.
struct ApiLimits {
  std::vector<std::string> model_names;  // accepted in the "model" field; the first is the id reported
  int n_ctx = 2048;                      // positions per sequence
  int max_tokens = 256;                  // default and upper limit of max_tokens
};

// The most alternatives per token a request may ask for: completions'
// `logprobs: N` and chat's `top_logprobs: N` (OpenAI allows 5 and 20).
inline constexpr int kMaxLogprobs = 20;
// The most prompts one completion request may hold.
inline constexpr int kMaxPrompts = 128;

// A validated, tokenized generation request: one choice of a response.
struct GenRequest {
  Endpoint endpoint = Endpoint::Completions;
  int index = 0;  // the choice it answers (a completion's prompt list: one each, in order)
  std::vector<int32_t> prompt;
  int max_tokens = 0;  // 0 only with echo: the prompt is scored, nothing generated
  // Log-probabilities of the generated tokens with this many alternatives
  // each (-1: none): completions' `logprobs: N`, chat's `logprobs: true`
  // with `top_logprobs: N`.
  int logprobs = -1;
  // Completions' `echo`: the prompt comes first in the returned text and,
  // with logprobs, every prompt token is scored (the first one as null).
  bool echo = false;
  std::string echo_text;    // the prompt as echoed: the text given, or the token ids decoded
  int echo_offset_skip = 0;  // leading prompt tokens not in echo_text (a BOS the tokenizer added)
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;  // extension: keep going past end-of-generation tokens (benchmarks)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parse /v1/completions and /v1/chat/completions bodies. Throw ApiError
// (HTTP 400) naming the field for wrong types, unsupported values (n > 1,
// tools, logprobs beyond kMaxLogprobs), out-of-range sampling parameters, an
// unknown model, an empty prompt or one longer than the context. Fields this
// server does not know are ignored. Without a seed, sampling is seeded at random.
// A completion's `prompt` may be a text, a list of token ids, or a list of
// texts or of token-id lists: one request per prompt, in order (index 0..).
std::vector<GenRequest> parse_completion_requests(const json& body, const Model& model, const ApiLimits& limits);
GenRequest parse_chat_request(const json& body, const Model& model, const ApiLimits& limits);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens not recomputed (prefix cache)
};
json usage_json(const Usage& u);

// Identity of one response, shared by all of its stream chunks.
struct ResponseId {
  Endpoint endpoint = Endpoint::Completions;
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

// Log-probabilities in OpenAI's shapes. Chat: {"content": [{token, logprob,
// bytes, top_logprobs: [{token, logprob, bytes}]}]}. Legacy completions:
// {tokens, token_logprobs, top_logprobs (token -> logprob, null for an
// unscored token), text_offset}; `offset` is the character offset in the
// choice's text where the first entry's token begins, advanced past the
// entries, and the first `skip` entries take no room in the text (a BOS the
// tokenizer added to a text prompt). A token's text is its bytes (control
// tokens spelled out) with bytes that are not UTF-8 alone as U+FFFD; chat's
// "bytes" are the raw bytes. Text offsets count code points (bytes that do not
// continue a UTF-8 sequence), as a Python client indexes the returned str.
json chat_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& entries);
json completion_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& entries, int64_t& offset,
                         int skip = 0);
// The assistant message of a chat answer: its content and, where the chat
// format has reasoning channels and the text uses them, the reasoning apart
// as "reasoning_content" (split_reasoning).
json chat_message(const ChatFormat& format, const std::string& text);

// One choice of a whole response: a completion's text, or a chat answer's
// message, and its log-probabilities (null when not asked).
struct Choice {
  int index = 0;
  std::string text;  // completions
  json message;      // chat: chat_message()
  FinishReason finish = FinishReason::Stop;
  json logprobs;
};
// A whole (non-streamed) response.
json completion_body(const ResponseId& r, const std::vector<Choice>& choices, const Usage& usage);
json completion_body(const ResponseId& r, const std::string& text, FinishReason finish, const Usage& usage);
// One stream chunk of choice `index` with a piece of text, its tokens'
// log-probabilities (null when not asked) and, on the last one, the finish
// reason. For chat, `first` adds the assistant role to the delta. With
// include_usage every chunk carries "usage": null, as OpenAI's do.
json stream_chunk(const ResponseId& r, const std::string& text, std::optional<FinishReason> finish, bool first,
                  bool include_usage, int index = 0, const json& logprobs = nullptr);
// The extra last chunk of stream_options.include_usage: no choices, the usage.
json usage_chunk(const ResponseId& r, const Usage& usage);
// "data: <json>\n\n", and the terminating "data: [DONE]\n\n".
std::string sse_event(const json& j);
extern const char* const kSseDone;

}  // namespace megakern::server
