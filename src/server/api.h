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
#include "runtime/sampler.h"

namespace megakern {
class Model;
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

// A validated, tokenized generation request.
struct GenRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;  // extension: keep going past end-of-generation tokens (benchmarks)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parse /v1/completions and /v1/chat/completions bodies. Throw ApiError
// (HTTP 400) naming the field for wrong types, unsupported values (n > 1,
// several prompts, logprobs, tools), out-of-range sampling parameters, an
// unknown model, an empty prompt or one longer than the context. Fields this
// server does not know are ignored. Without a seed, sampling is seeded at random.
GenRequest parse_completion_request(const json& body, const Model& model, const ApiLimits& limits);
GenRequest parse_chat_request(const json& body, const Model& model, const ApiLimits& limits);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};
json usage_json(const Usage& u);

// Identity of one response, shared by all of its stream chunks.
struct ResponseId {
  Endpoint endpoint = Endpoint::Completions;
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

// A whole (non-streamed) response.
json completion_body(const ResponseId& r, const std::string& text, FinishReason finish, const Usage& usage);
// One stream chunk with a piece of text and, on the last one, the finish
// reason. For chat, `first` adds the assistant role to the delta. With
// include_usage every chunk carries "usage": null, as OpenAI's do.
json stream_chunk(const ResponseId& r, const std::string& text, std::optional<FinishReason> finish, bool first,
                  bool include_usage);
// The extra last chunk of stream_options.include_usage: no choices, the usage.
json usage_chunk(const ResponseId& r, const Usage& usage);
// "data: <json>\n\n", and the terminating "data: [DONE]\n\n".
std::string sse_event(const json& j);
extern const char* const kSseDone;

}  // namespace megakern::server
