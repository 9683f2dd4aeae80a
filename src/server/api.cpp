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
                  GenRequest& r, int min_tokens = 1) {
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
  if (const json* tools = field(body, "tools"); tools && !(tools->is_array() && tools->empty()))
    bad_param("tools", "tool calls are not supported by this server");
  // Fields that would change what is generated or returned, which this
  // server cannot honour: refused rather than silently ignored.
  if (const json* f = field(body, "functions"); f && !(f->is_array() && f->empty()))
    bad_param("functions", "function calls are not supported by this server");
  if (field(body, "function_call")) bad_param("function_call", "function calls are not supported by this server");
  if (const json* tc = field(body, "tool_choice"); tc && !(tc->is_string() && tc->get<std::string>() == "none"))
    bad_param("tool_choice", "tool calls are not supported by this server (only 'tool_choice': 'none')");

  r.max_tokens = limits.max_tokens;
  for (const char* key : max_tokens_keys) {
    if (auto v = get_int(body, key)) {
      if (*v < min_tokens)
        bad_param(key, "'{}' must be at least {}, got {}{}", key, min_tokens, *v,
                  min_tokens > 0 ? " (0 scores the prompt only, with 'echo': true)" : "");
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

// An alternatives count in 0..kMaxLogprobs.
int logprob_count(const json& body, const char* key) {
  const auto n = get_int(body, key);
  if (*n < 0 || *n > kMaxLogprobs)
    bad_param(key, "'{}' must be in 0..{} (the most alternatives per token this server returns), got {}", key,
              kMaxLogprobs, *n);
  return static_cast<int>(*n);
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
    if (!t.is_number_integer()) bad_param("prompt", "a token prompt must hold integers only, got {}", t.type_name());
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

std::vector<GenRequest> parse_completion_requests(const json& body, const Model& model, const ApiLimits& limits) {
  GenRequest r;
  r.endpoint = Endpoint::Completions;
  r.echo = get_bool(body, "echo", false);
  parse_common(body, limits, {"max_tokens"}, r, r.echo ? 0 : 1);
  if (const json* lp = field(body, "logprobs")) {
    // Legacy completions take the number of alternatives; `true` is chat's spelling.
    if (lp->is_boolean())
      bad_param("logprobs", "'logprobs' of a completion is the number of alternatives per token (an integer "
                            "0..{}), got a boolean",
                kMaxLogprobs);
    r.logprobs = logprob_count(body, "logprobs");
  }
  if (const json* tl = field(body, "top_logprobs"); tl && !(tl->is_number() && tl->get<double>() == 0))
    bad_param("top_logprobs", "'top_logprobs' is a chat completion parameter: completions take 'logprobs': N");
  if (const json* s = field(body, "suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
    bad_param("suffix", "'suffix' is not supported by this server");
  const json* p = field(body, "prompt");
  if (!p) bad_param("prompt", "'prompt' is required");
  const Tokenizer& tok = model.tokenizer();
  std::vector<GenRequest> out;
  auto add_text = [&](const std::string& text) {
    GenRequest q = r;
    // Control tokens written in the prompt ("<|im_start|>") become their ids,
    // so a client can write a chat template by hand.
    try {
      q.prompt = tok.encode(text, tok.add_bos_default(), /*parse_special=*/true);
    } catch (const Error& e) {
      bad_param("prompt", "the prompt cannot be tokenized: {}", e.what());
    }
    q.echo_text = text;
    q.echo_offset_skip = tok.add_bos_default() && !q.prompt.empty() ? 1 : 0;
    out.push_back(std::move(q));
  };
  auto add_tokens = [&](const json& a) {
    GenRequest q = r;
    q.prompt = token_array(a, model);
    if (q.echo) q.echo_text = tok.decode(q.prompt, /*skip_special=*/false);
    out.push_back(std::move(q));
  };
  if (p->is_string()) {
    add_text(p->get<std::string>());
  } else if (p->is_array()) {
    if (p->empty()) bad_param("prompt", "'prompt' is an empty array");
    const json& first = (*p)[0];
    if (first.is_number()) {
      add_tokens(*p);  // one prompt of token ids
    } else {
      if (p->size() > static_cast<size_t>(kMaxPrompts))
        bad_param("prompt", "'prompt' holds {} prompts, more than the {} one request may hold", p->size(), kMaxPrompts);
      // Several prompts, all texts or all token-id lists.
      for (size_t i = 0; i < p->size(); ++i) {
        const json& e = (*p)[i];
        if (first.is_string() && e.is_string())
          add_text(e.get<std::string>());
        else if (first.is_array() && e.is_array() && !e.empty())
          add_tokens(e);
        else
          bad_param("prompt",
                    "'prompt' must be a string, an array of token ids, or an array of strings or of non-empty token-id "
                    "arrays (prompt[{}] is {})",
                    i, e.is_array() && e.empty() ? "an empty array" : e.type_name());
      }
    }
  } else {
    bad_param("prompt", "'prompt' must be a string or an array, got {}", p->type_name());
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].index = static_cast<int>(i);
    check_prompt_length(out[i], limits, "prompt");
  }
  return out;
}

GenRequest parse_chat_request(const json& body, const Model& model, const ApiLimits& limits) {
  GenRequest r;
  r.endpoint = Endpoint::ChatCompletions;
  parse_common(body, limits, {"max_tokens", "max_completion_tokens"}, r);
  const bool logprobs = get_bool(body, "logprobs", false);
  const int top = field(body, "top_logprobs") ? logprob_count(body, "top_logprobs") : 0;
  if (top > 0 && !logprobs) bad_param("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (logprobs) r.logprobs = top;
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
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
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

namespace {
// A token's text: its bytes (control tokens spelled out), with what is not
// UTF-8 as U+FFFD, as the client will read it (so that the keys of a
// top_logprobs dict are distinct as the client sees them).
std::string token_piece(const Tokenizer& tok, int32_t id) {
  const std::string& b = tok.token_bytes(id);
  if (std::all_of(b.begin(), b.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return b;
  return json::parse(dump_json(json(b))).get<std::string>();
}
// The code points of UTF-8 text: bytes that do not continue a sequence.
int64_t code_points(const std::string& s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}
json logprob_value(const TokenLogprob& e) { return e.scored ? json(e.logprob) : json(nullptr); }
json bytes_of(const std::string& s) {
  json b = json::array();
  for (char c : s) b.push_back(static_cast<unsigned char>(c));
  return b;
}
}  // namespace

json chat_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& entries) {
  json content = json::array();
  for (const TokenLogprob& e : entries) {
    json top = json::array();
    for (const auto& [id, lp] : e.top)
      top.push_back({{"token", token_piece(tok, id)}, {"logprob", lp}, {"bytes", bytes_of(tok.token_bytes(id))}});
    content.push_back({{"token", token_piece(tok, e.token)},
                       {"logprob", logprob_value(e)},
                       {"bytes", bytes_of(tok.token_bytes(e.token))},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json completion_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& entries, int64_t& offset, int skip) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), text_offset = json::array();
  for (size_t i = 0; i < entries.size(); ++i) {
    const TokenLogprob& e = entries[i];
    tokens.push_back(token_piece(tok, e.token));
    token_logprobs.push_back(logprob_value(e));
    if (e.scored) {
      // Distinct tokens may share a text: the dict keeps the likeliest.
      json top = json::object();
      for (const auto& [id, lp] : e.top) {
        const std::string t = token_piece(tok, id);
        if (!top.contains(t)) top[t] = lp;
      }
      top_logprobs.push_back(top);
    } else {
      top_logprobs.push_back(nullptr);
    }
    text_offset.push_back(offset);
    if (static_cast<int>(i) >= skip) offset += code_points(tok.token_bytes(e.token));
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
          {"text_offset", text_offset}};
}

json chat_message(const ChatFormat& format, const std::string& text) {
  json m = {{"role", "assistant"}};
  if (has_reasoning_channels(format)) {
    ReasoningSplit split = split_reasoning(format, text);
    m["content"] = split.content;
    if (split.reasoning) m["reasoning_content"] = *split.reasoning;
    return m;
  }
  m["content"] = text;
  return m;
}

json completion_body(const ResponseId& r, const std::vector<Choice>& choices, const Usage& usage) {
  json j = header(r, false);
  j["choices"] = json::array();
  for (const Choice& c : choices) {
    json choice = {{"index", c.index}, {"logprobs", c.logprobs}, {"finish_reason", finish_reason_name(c.finish)}};
    if (r.endpoint == Endpoint::Completions)
      choice["text"] = c.text;
    else
      choice["message"] = c.message.is_null() ? json{{"role", "assistant"}, {"content", c.text}} : c.message;
    j["choices"].push_back(std::move(choice));
  }
  j["usage"] = usage_json(usage);
  return j;
}

json completion_body(const ResponseId& r, const std::string& text, FinishReason finish, const Usage& usage) {
  Choice c;
  c.text = text;
  c.finish = finish;
  return completion_body(r, std::vector<Choice>{c}, usage);
}

json stream_chunk(const ResponseId& r, const std::string& text, std::optional<FinishReason> finish, bool first,
                  bool include_usage, int index, const json& logprobs) {
  json j = header(r, true);
  json choice = {{"index", index}, {"logprobs", logprobs}, {"finish_reason", finish_json(finish)}};
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
