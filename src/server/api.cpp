#include "server/api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "runtime/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace megakern::server {

std::string json_number_text(const json& v) {
  if (v.is_number()) return v.dump();
  return v.type_name();
}

json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

json error_body(const ApiError& e) { return error_body(e.what(), e.type, e.param, e.code); }

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_json_object(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!j.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", j.type_name()));
  return j;
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "error";
}

namespace {

// A field's value, or nullptr when it is absent or null (OpenAI clients send
// null for "not given").
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const json& body, const char* key, bool dflt) {
  const json* v = field(body, key);
  if (!v) return dflt;
  if (!v->is_boolean()) bad_param(key, "'{}' must be a boolean, got {}", key, v->type_name());
  return v->get<bool>();
}

std::optional<int64_t> get_int(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    bad_param(key, "'{}' is out of range: {} is too large an integer", key, v->dump());
  if (v->is_number_integer()) return v->get<int64_t>();
  // 3.0 is an integer in JSON's eyes (JavaScript clients send such values).
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()))
    bad_param(key, "'{}' is out of range: {} is too large an integer", key, v->dump());
  bad_param(key, "'{}' must be an integer, got {}", key, json_number_text(*v));
}

std::optional<double> get_number(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_param(key, "'{}' must be a number, got {}", key, v->type_name());
  return v->get<double>();
}

// Fields common to both endpoints: model, n, sampling, max_tokens, stop,
// streaming. `max_tokens_keys` lists the names the endpoint accepts for it.
void parse_common(const json& body, const ApiLimits& limits, std::initializer_list<const char*> max_tokens_keys,
                  GenRequest& r) {
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) bad_param("model", "'model' must be a string, got {}", m->type_name());
    const std::string name = m->get<std::string>();
    const auto& names = limits.model_names;
    if (std::find(names.begin(), names.end(), name) == names.end())
      throw ApiError(400,
                     fmt::format("the model '{}' does not exist: this server serves '{}'", printable(name),
                                 printable(names.at(0))),
                     "invalid_request_error", "model", "model_not_found");
  }
  if (auto n = get_int(body, "n"); n && *n != 1)
    bad_param("n", "only one choice per request is supported ('n' must be 1, got {})", *n);
  if (auto b = get_int(body, "best_of"); b && *b != 1)
    bad_param("best_of", "'best_of' must be 1 (got {}): several candidates are not supported", *b);
  if (const json* lp = field(body, "logprobs")) {
    const bool wanted = lp->is_boolean() ? lp->get<bool>() : !(lp->is_number() && lp->get<double>() == 0);
    if (wanted) bad_param("logprobs", "'logprobs' is not supported by this server");
  }
  if (const json* tools = field(body, "tools"); tools && !(tools->is_array() && tools->empty()))
    bad_param("tools", "tool calls are not supported by this server");
  // Fields that would change what is generated or returned, which this
  // server cannot honour: refused rather than silently ignored.
  if (const json* f = field(body, "functions"); f && !(f->is_array() && f->empty()))
    bad_param("functions", "function calls are not supported by this server");
  if (field(body, "function_call")) bad_param("function_call", "function calls are not supported by this server");
  if (const json* tc = field(body, "tool_choice"); tc && !(tc->is_string() && tc->get<std::string>() == "none"))
    bad_param("tool_choice", "tool calls are not supported by this server (only 'tool_choice': 'none')");
  if (const json* tl = field(body, "top_logprobs"); tl && !(tl->is_number() && tl->get<double>() == 0))
    bad_param("top_logprobs", "'top_logprobs' is not supported by this server");

  r.max_tokens = limits.max_tokens;
  for (const char* key : max_tokens_keys) {
    if (auto v = get_int(body, key)) {
      if (*v < 1) bad_param(key, "'{}' must be at least 1, got {}", key, *v);
      // Larger requests are served up to the server's limit, ending with
      // finish_reason "length" as they would at the end of the context.
      r.max_tokens = static_cast<int>(std::min<int64_t>(*v, limits.max_tokens));
    }
  }

  r.sampling = SamplingParams{};
  r.sampling.temperature = 1.f;  // OpenAI's default
  if (auto t = get_number(body, "temperature")) {
    // Checked as the double it was sent as: a value beyond float's range
    // would otherwise be reported as the "inf" it turns into.
    if (!std::isfinite(*t) || *t < 0 || *t > std::numeric_limits<float>::max())
      bad_param("temperature", "'temperature' must be a finite number >= 0, got {}", body["temperature"].dump());
    r.sampling.temperature = static_cast<float>(*t);
  }
  if (auto p = get_number(body, "top_p")) {
    if (!(*p > 0 && *p <= 1)) bad_param("top_p", "'top_p' must be in (0, 1], got {}", body["top_p"].dump());
    r.sampling.top_p = static_cast<float>(*p);
  }
  if (auto k = get_int(body, "top_k")) {
    if (*k < 0) bad_param("top_k", "'top_k' must be >= 0 (0 disables it), got {}", *k);
    r.sampling.top_k = static_cast<int>(std::min<int64_t>(*k, std::numeric_limits<int>::max()));
  }
  if (auto s = get_int(body, "seed")) {
    r.sampling.seed = static_cast<uint64_t>(*s);
  } else {
    std::random_device rd;
    r.sampling.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  try {
    validate(r.sampling);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "invalid_request_error", "temperature");
  }

  if (const json* s = field(body, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 16) bad_param("stop", "at most 16 stop strings are supported, got {}", s->size());
      for (const auto& e : *s) {
        if (!e.is_string()) bad_param("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(e.get<std::string>());
      }
    } else {
      bad_param("stop", "'stop' must be a string or an array of strings, got {}", s->type_name());
    }
  }
  r.ignore_eos = get_bool(body, "ignore_eos", false);
  r.stream = get_bool(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad_param("stream_options", "'stream_options' must be an object, got {}", so->type_name());
    r.include_usage = get_bool(*so, "include_usage", false);
  }
}

void check_prompt_length(const GenRequest& r, const ApiLimits& limits, const char* param) {
  if (r.prompt.empty()) bad_param(param, "the prompt is empty: there is nothing to continue");
  if (static_cast<int64_t>(r.prompt.size()) > limits.n_ctx)
    throw ApiError(400,
                   fmt::format("the prompt has {} tokens, more than the context of {} tokens", r.prompt.size(),
                               limits.n_ctx),
                   "invalid_request_error", param, "context_length_exceeded");
}

std::vector<int32_t> token_array(const json& a, const Model& model) {
  std::vector<int32_t> out;
  for (const auto& t : a) {
    if (!t.is_number_integer()) bad_param("prompt", "a token prompt must hold integers only");
    // Unsigned ids past 2^63 would turn negative in an int64_t: compare first.
    const int64_t id = t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)
                           ? int64_t{-1}
                           : t.get<int64_t>();
    if (id < 0 || id >= model.tokenizer().n_vocab())
      bad_param("prompt", "token id {} is outside the vocabulary of {} tokens", t.dump(), model.tokenizer().n_vocab());
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

}  // namespace

GenRequest parse_completion_request(const json& body, const Model& model, const ApiLimits& limits) {
  GenRequest r;
  r.endpoint = Endpoint::Completions;
  parse_common(body, limits, {"max_tokens"}, r);
  if (get_bool(body, "echo", false)) bad_param("echo", "'echo' is not supported by this server");
  if (const json* s = field(body, "suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
    bad_param("suffix", "'suffix' is not supported by this server");
  const json* p = field(body, "prompt");
  if (!p) bad_param("prompt", "'prompt' is required");
  const Tokenizer& tok = model.tokenizer();
  auto encode = [&](const std::string& text) {
    // Control tokens written in the prompt ("<|im_start|>") become their ids,
    // so a client can write a chat template by hand.
    try {
      return tok.encode(text, tok.add_bos_default(), /*parse_special=*/true);
    } catch (const Error& e) {
      bad_param("prompt", "the prompt cannot be tokenized: {}", e.what());
    }
  };
  if (p->is_string()) {
    r.prompt = encode(p->get<std::string>());
  } else if (p->is_array()) {
    if (p->empty()) bad_param("prompt", "'prompt' is an empty array");
    const json& first = (*p)[0];
    if (first.is_number_integer()) {
      r.prompt = token_array(*p, model);
    } else {
      if (p->size() != 1) bad_param("prompt", "only one prompt per request is supported, got {}", p->size());
      if (first.is_string())
        r.prompt = encode(first.get<std::string>());
      else if (first.is_array())
        r.prompt = token_array(first, model);
      else
        bad_param("prompt", "'prompt' must be a string, an array of token ids or an array holding one of them");
    }
  } else {
    bad_param("prompt", "'prompt' must be a string or an array, got {}", p->type_name());
  }
  check_prompt_length(r, limits, "prompt");
  return r;
}

GenRequest parse_chat_request(const json& body, const Model& model, const ApiLimits& limits) {
  GenRequest r;
  r.endpoint = Endpoint::ChatCompletions;
  parse_common(body, limits, {"max_tokens", "max_completion_tokens"}, r);
  for (const char* key : {"echo", "suffix"})
    if (field(body, key)) bad_param(key, "'{}' is not a chat completion parameter", key);
  if (const json* rf = field(body, "response_format")) {
    const json* t = rf->is_object() ? field(*rf, "type") : nullptr;
    if (!t || !t->is_string() || t->get<std::string>() != "text")
      bad_param("response_format", "only the 'text' response format is supported");
  }
  const json* m = field(body, "messages");
  if (!m) bad_param("messages", "'messages' is required");
  if (!m->is_array() || m->empty()) bad_param("messages", "'messages' must be a non-empty array");
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!msg.is_object()) bad_param(where, "{} must be an object, got {}", where, msg.type_name());
    const json* role = field(msg, "role");
    if (!role || !role->is_string()) bad_param(where + ".role", "{} needs a string 'role'", where);
    ChatMessage cm;
    cm.role = role->get<std::string>();
    if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for the system role
    // The role is written into the template verbatim: only the roles every
    // template knows are accepted (no tool turns: tools are not supported).
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
      bad_param(where + ".role", "{}.role must be 'system', 'developer', 'user' or 'assistant', got '{}'", where,
                printable(role->get<std::string>(), 64));
    const json* c = field(msg, "content");
    if (!c) bad_param(where + ".content", "{}.content is required (a string or an array of text parts)", where);
    if (c->is_array() && c->empty())
      bad_param(where + ".content", "{}.content is an empty array: give at least one text part", where);
    {
      if (c->is_string()) {
        cm.content = c->get<std::string>();
      } else if (c->is_array()) {
        // Content parts: text parts are concatenated; other kinds (images,
        // audio) cannot be given to a text model.
        for (const auto& part : *c) {
          const json* type = part.is_object() ? field(part, "type") : nullptr;
          const json* text = part.is_object() ? field(part, "text") : nullptr;
          if (!type || !type->is_string() || type->get<std::string>() != "text" || !text || !text->is_string())
            bad_param(where + ".content", "{}: only text content parts are supported", where);
          cm.content += text->get<std::string>();
        }
      } else {
        bad_param(where + ".content", "{}.content must be a string or an array of parts, got {}", where,
                  c->type_name());
      }
    }
    msgs.push_back(std::move(cm));
  }
  const Tokenizer& tok = model.tokenizer();
  // Only the template's own markers become control tokens: "<|im_end|>"
  // written in a message is text, so no message can end its turn early or
  // forge another role's.
  const RenderedChat chat = render_chat_marked(model.chat_format(), msgs, /*add_generation_prompt=*/true);
  try {
    r.prompt = tok.encode_marked(chat.text, chat.markers, tok.add_bos_default());
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    bad_param("messages", "the messages cannot be tokenized: {}", e.what());
  }
  check_prompt_length(r, limits, "messages");
  return r;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {
json header(const ResponseId& r, bool chunk) {
  const char* object = r.endpoint == Endpoint::Completions ? "text_completion"
                       : chunk                            ? "chat.completion.chunk"
                                                          : "chat.completion";
  return {{"id", r.id}, {"object", object}, {"created", r.created}, {"model", r.model}};
}
json finish_json(std::optional<FinishReason> f) { return f ? json(finish_reason_name(*f)) : json(nullptr); }
}  // namespace

json completion_body(const ResponseId& r, const std::string& text, FinishReason finish, const Usage& usage) {
  json j = header(r, false);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason_name(finish)}};
  if (r.endpoint == Endpoint::Completions)
    choice["text"] = text;
  else
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(usage);
  return j;
}

json stream_chunk(const ResponseId& r, const std::string& text, std::optional<FinishReason> finish, bool first,
                  bool include_usage) {
  json j = header(r, true);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_json(finish)}};
  if (r.endpoint == Endpoint::Completions) {
    choice["text"] = text;
  } else {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  }
  j["choices"] = json::array({choice});
  if (include_usage) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const ResponseId& r, const Usage& usage) {
  json j = header(r, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return j;
}

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }
const char* const kSseDone = "data: [DONE]\n\n";

}  // namespace megakern::server
