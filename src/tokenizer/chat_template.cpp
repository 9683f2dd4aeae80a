#include "tokenizer/chat_template.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace megakern {

const char* const kSmolLM2DefaultSystemPrompt = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

namespace {

// Whether a code point counts as whitespace for Jinja's `trim` filter, which is
// Python's str.strip(): ASCII whitespace, the information separators
// U+001C..U+001F, NEL, and the Unicode space separators.
bool is_python_space(uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || cp == 0x2028 || cp == 0x2029) return true;
  if ((cp >= 0x2000 && cp <= 0x200A) || cp == 0x202F || cp == 0x205F || cp == 0x3000) return true;
  return false;
}

// Trims like Python's str.strip(). Content that is not valid UTF-8 is trimmed
// of ASCII whitespace only, since it cannot be decoded reliably.
std::string_view trim(std::string_view s) {
  if (tokenizer_detail::utf8_first_invalid(s) != std::string_view::npos) {
    const size_t b = s.find_first_not_of(" \t\n\v\f\r");
    if (b == std::string_view::npos) return {};
    const size_t e = s.find_last_not_of(" \t\n\v\f\r");
    return s.substr(b, e - b + 1);
  }
  size_t begin = 0;
  size_t end = 0;  // one past the last non-space character seen
  bool seen = false;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const uint32_t cp = tokenizer_detail::utf8_decode(s, pos);
    if (is_python_space(cp)) continue;
    if (!seen) begin = start;
    seen = true;
    end = pos;
  }
  return seen ? s.substr(begin, end - begin) : std::string_view{};
}

// Finds the system prompt a ChatML template inserts when the conversation has
// none, e.g. SmolLM2's
//   {% if loop.first and messages[0]['role'] != 'system' %}
//   {{ '<|im_start|>system\nYou are ...<|im_end|>\n' }}{% endif %}
// The newline may be stored literally or as the escape "\n".
std::optional<std::string> extract_default_system_prompt(const std::string& tmpl) {
  if (tmpl.find("!= 'system'") == std::string::npos && tmpl.find("!= \"system\"") == std::string::npos)
    return std::nullopt;
  const std::string_view open = "<|im_start|>system";
  size_t pos = tmpl.find(open);
  if (pos == std::string::npos) return std::nullopt;
  pos += open.size();
  if (tmpl.compare(pos, 1, "\n") == 0) {
    pos += 1;
  } else if (tmpl.compare(pos, 2, "\\n") == 0) {
    pos += 2;
  } else {
    return std::nullopt;
  }
  const size_t end = tmpl.find("<|im_end|>", pos);
  if (end == std::string::npos) return std::nullopt;
  std::string prompt = tmpl.substr(pos, end - pos);
  // A prompt that contains template syntax is computed, not fixed text.
  if (prompt.find("{{") != std::string::npos || prompt.find("{%") != std::string::npos || prompt.find('\'') != std::string::npos)
    return std::nullopt;
  std::string unescaped;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] == '\\' && i + 1 < prompt.size() && prompt[i + 1] == 'n') {
      unescaped.push_back('\n');
      ++i;
    } else {
      unescaped.push_back(prompt[i]);
    }
  }
  return unescaped;
}

// Appends a control marker of the template, recording where it is.
void mark(RenderedChat& rc, std::string_view marker) {
  rc.markers.emplace_back(rc.text.size(), rc.text.size() + marker.size());
  rc.text += marker;
}

void render_chatml(const ChatFormat& format, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                   RenderedChat& rc) {
  std::string& out = rc.text;
  auto turn = [&](std::string_view role, std::string_view content) {
    mark(rc, "<|im_start|>");
    out += role;
    out += '\n';
    out += content;
    mark(rc, "<|im_end|>");
    out += '\n';
  };
  if (!messages.empty() && messages.front().role != "system" && format.default_system_prompt)
    turn("system", *format.default_system_prompt);
  for (const ChatMessage& m : messages) turn(m.role, m.content);
  if (add_generation_prompt) {
    mark(rc, "<|im_start|>");
    out += "assistant\n";
  }
}

void render_gemma(const std::vector<ChatMessage>& messages, bool add_generation_prompt, RenderedChat& rc) {
  std::string& out = rc.text;
  size_t first = 0;
  std::string prefix;  // the system message, carried into the first turn
  if (!messages.empty() && messages.front().role == "system") {
    prefix = messages.front().content + "\n\n";
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    mark(rc, "<start_of_turn>");
    out += m.role == "assistant" ? std::string_view("model") : std::string_view(m.role);
    out += '\n';
    if (i == first) out += prefix;
    out += trim(m.content);
    mark(rc, "<end_of_turn>");
    out += '\n';
  }
  if (add_generation_prompt) {
    mark(rc, "<start_of_turn>");
    out += "model\n";
  }
}


// Marks, in the bytes that came from the template, every control token it
// writes (longest match first).
std::vector<std::pair<size_t, size_t>> find_markers(const jinja::Rendered& r,
                                                    const std::vector<std::string>& control_tokens) {
  std::vector<std::vector<const std::string*>> by_first(256);
  for (const std::string& t : control_tokens)
    if (!t.empty()) by_first[static_cast<unsigned char>(t[0])].push_back(&t);
  for (auto& bucket : by_first)
    std::sort(bucket.begin(), bucket.end(), [](const std::string* a, const std::string* b) { return a->size() > b->size(); });
  std::vector<std::pair<size_t, size_t>> markers;
  const std::string& text = r.text;
  for (size_t i = 0; i < text.size();) {
    const auto& bucket = by_first[static_cast<unsigned char>(text[i])];
    size_t len = 0;
    if (r.from_data[i] == 0) {
      for (const std::string* t : bucket) {
        if (text.compare(i, t->size(), *t) != 0) continue;
        if (r.from_data.find('\1', i) < i + t->size()) continue;
        len = t->size();
        break;
      }
    }
    if (len) {
      markers.emplace_back(i, i + len);
      i += len;
    } else {
      ++i;
    }
  }
  return markers;
}

nlohmann::ordered_json messages_json(const std::vector<ChatMessage>& messages) {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) arr.push_back({{"role", m.role}, {"content", m.content}});
  return arr;
}

// Drops a leading BOS marker from the text (the encoder adds BOS itself).
void strip_leading_bos(RenderedChat& rc, const ChatFormat& f) {
  const std::string& bos = f.bos_token;
  if (!f.encoder_adds_bos || bos.empty() || rc.markers.empty() || rc.markers[0] != std::pair<size_t, size_t>{0, bos.size()}) return;
  if (rc.text.compare(0, bos.size(), bos) != 0) return;
  rc.text.erase(0, bos.size());
  rc.markers.erase(rc.markers.begin());
  for (auto& [b, e] : rc.markers) {
    b -= bos.size();
    e -= bos.size();
  }
}

// --- Kimi K3 (the published openai_server.render_chat_tokens)
constexpr const char* kKimiOpen = "<|open|>";
constexpr const char* kKimiClose = "<|close|>";
constexpr const char* kKimiSep = "<|sep|>";
constexpr const char* kKimiEnd = "<|end_of_msg|>";
constexpr const char* kKimiChannelSwitch = "<|close|>think<|sep|><|open|>response<|sep|>";
constexpr const char* kKimiResponseTail = "<|close|>response<|sep|><|close|>message<|sep|>";

void render_kimi(const ChatFormat& f, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                 RenderedChat& rc) {
  auto open = [&](std::string_view tag) {
    mark(rc, kKimiOpen);
    rc.text += tag;
    mark(rc, kKimiSep);
  };
  auto close = [&](std::string_view tag) {
    mark(rc, kKimiClose);
    rc.text += tag;
    mark(rc, kKimiSep);
  };
  bool has_system = false;
  for (const ChatMessage& m : messages) has_system = has_system || m.role == "system";
  if (f.think && !has_system) {
    open("message role=\"system\" type=\"thinking-effort\"");
    rc.text +=
        "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
        "channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with "
        "`thinking_effort=max`.";
    close("message");
    mark(rc, kKimiEnd);
  }
  for (const ChatMessage& m : messages) {
    if (m.role == "assistant") {
      open("message role=\"assistant\"");
      open("response");
      rc.text += m.content;
      close("response");
      close("message");
      mark(rc, kKimiEnd);
    } else if (m.role == "system" || m.role == "user" || m.role == "developer") {
      open(fmt::format("message role=\"{}\"", m.role == "developer" ? "system" : m.role));
      rc.text += m.content;
      close("message");
      mark(rc, kKimiEnd);
    } else {
      fail("chat format kimi-k3: unsupported message role '{}' (expected system, developer, user or assistant)",
           printable(m.role, 64));
    }
  }
  if (add_generation_prompt) {
    open("message role=\"assistant\"");
    open(f.think ? "think" : "response");
  }
}

// --- Muse Spark (the published musespark/chat.py)
constexpr const char* kMuseBos = "<|begin_of_text|>";
constexpr const char* kMuseStart = "<|start|>";
constexpr const char* kMuseMessage = "<|message|>";
constexpr const char* kMuseEot = "<|eot|>";
constexpr const char* kMuseEom = "<|eom|>";

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  size_t at = 0;
  while ((at = s.find(from, at)) != std::string::npos) {
    s.replace(at, from.size(), to);
    at += to.size();
  }
  return s;
}

// Caller text is written so that it never spells a control token.
std::string muse_escape(std::string s) {
  s = replace_all(std::move(s), "<|", "< |");
  s = replace_all(std::move(s), "<image>", "< image>");
  s = replace_all(std::move(s), "<video>", "< video>");
  return replace_all(std::move(s), "<audio>", "< audio>");
}

int muse_strength(const std::string& effort) {
  if (effort == "minimal") return 1;
  if (effort == "low") return 16;
  if (effort == "medium") return 64;
  if (effort == "high") return 256;
  if (effort == "xhigh") return 512;
  return 0;
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void render_muse(const ChatFormat& f, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                 RenderedChat& rc) {
  size_t first = 0;
  std::optional<std::string> instructions;
  if (!messages.empty() && (messages[0].role == "system" || messages[0].role == "developer")) {
    instructions = messages[0].content;
    first = 1;
  }
  std::vector<std::string> parts = {"You are a helpful AI assistant.", "Knowledge cutoff: 2026-01-04."};
  if (instructions && !instructions->empty()) {
    std::string ins = muse_escape(*instructions);
    ins = replace_all(std::move(ins), "Reasoning effort", "Reasoning strength");
    ins = replace_all(std::move(ins), "Reasoning Effort", "Reasoning Strength");
    ins = replace_all(std::move(ins), "reasoning effort", "reasoning strength");
    ins = replace_all(std::move(ins), "REASONING EFFORT", "REASONING STRENGTH");
    instructions = ins;
    parts.push_back(ins);
  }
  const int strength = muse_strength(f.reasoning_effort);
  if (strength > 0 && ascii_lower(instructions.value_or("")).find("reasoning strength:") == std::string::npos)
    parts.push_back(fmt::format("Reasoning strength: {}.", strength));
  parts.push_back(
      "Use the appropriate recipient for each message:\n\n"
      "- \"self\": private reasoning and tool planning.\n"
      "- \"commentary\": user-visible intermediate updates while the assistant will continue working, including "
      "messages sent to the user before or between tool calls.\n"
      "- \"user\": messages that end the assistant turn, such as a completed response or clarification question "
      "that waits for the user's reply; do not use for pre-tool updates or partial responses.\n\n"
      "# Valid recipients: \"self\", \"commentary\", \"user\".");
  mark(rc, kMuseBos);
  mark(rc, kMuseStart);
  rc.text += "system";
  mark(rc, kMuseMessage);
  for (size_t k = 0; k < parts.size(); ++k) {
    if (k) rc.text += "\n\n";
    rc.text += parts[k];
  }
  mark(rc, kMuseEot);
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system" || m.role == "developer" || m.role == "user") {
      mark(rc, kMuseStart);
      rc.text += m.role;
      mark(rc, kMuseMessage);
      rc.text += muse_escape(m.content);
      mark(rc, kMuseEot);
    } else if (m.role == "assistant") {
      mark(rc, kMuseStart);
      rc.text += "assistant to=user";
      mark(rc, kMuseMessage);
      rc.text += muse_escape(m.content);
      mark(rc, kMuseEot);
    } else {
      fail("chat format muse-spark: unsupported message role '{}' (expected system, developer, user or assistant)",
           printable(m.role, 64));
    }
  }
  if (add_generation_prompt) {
    mark(rc, kMuseStart);
    rc.text += "assistant";
  }
}

// --- Qwen3.8 (the published demo_qwen_dflash.render_chat_tokens)
void render_qwen38(const ChatFormat& f, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                   RenderedChat& rc) {
  auto scaffold = [&] {
    mark(rc, "<think>");
    rc.text += "\n\n";
    mark(rc, "</think>");
    rc.text += "\n\n";
  };
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      fail("chat format qwen3.8: unsupported message role '{}' (expected system, user or assistant)",
           printable(m.role, 64));
    mark(rc, "<|im_start|>");
    rc.text += m.role;
    rc.text += '\n';
    if (m.role == "assistant") scaffold();
    rc.text += m.content;
    mark(rc, "<|im_end|>");
    rc.text += '\n';
  }
  if (add_generation_prompt) {
    mark(rc, "<|im_start|>");
    rc.text += "assistant\n";
    if (f.think) {
      mark(rc, "<think>");
      rc.text += "\n";
    } else {
      scaffold();
    }
  }
}

std::string_view trim_ascii(std::string_view s, std::string_view chars = " \t\n\r\v\f") {
  const size_t b = s.find_first_not_of(chars);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(chars);
  return s.substr(b, e - b + 1);
}

}  // namespace

ChatFormat ChatFormat::standard(ChatTemplate kind) {
  ChatFormat f;
  f.kind = kind;
  if (kind == ChatTemplate::ChatML) f.default_system_prompt = kSmolLM2DefaultSystemPrompt;
  return f;
}

ChatFormat chat_format_from_template(const std::string& tmpl) {
  if (!tmpl.empty()) {
    try {
      return jinja_chat_format(tmpl);
    } catch (const Error&) {
      // A template this renderer cannot parse: fall back to recognising its family.
    }
  }
  ChatFormat f;
  if (tmpl.find("<|im_start|>") != std::string::npos) {
    f.kind = ChatTemplate::ChatML;
    f.default_system_prompt = extract_default_system_prompt(tmpl);
  } else if (tmpl.find("<start_of_turn>") != std::string::npos) {
    f.kind = ChatTemplate::Gemma;
  }
  return f;
}

ChatFormat detect_chat_format(const GGUFFile& file) {
  ChatFormat f;
  const std::optional<std::string> tmpl = file.get_string_opt("tokenizer.chat_template");
  if (tmpl && !tmpl->empty()) {
    f = chat_format_from_template(*tmpl);
    if (f.kind != ChatTemplate::None) return f;
  }
  const std::string arch = file.get_string_opt("general.architecture").value_or("");
  if (arch.rfind("gemma", 0) == 0) {
    f.kind = ChatTemplate::Gemma;
    return f;
  }
  if (const GGUFValue* tokens = file.find("tokenizer.ggml.tokens")) {
    for (const std::string& t : tokens->strings) {
      if (t == "<|im_start|>") {
        f.kind = ChatTemplate::ChatML;
        return f;
      }
    }
  }
  return f;
}

ChatTemplate detect_chat_template(const GGUFFile& file) { return detect_chat_format(file).kind; }

std::string render_chat(ChatTemplate kind, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  return render_chat(ChatFormat::standard(kind), messages, add_generation_prompt);
}

std::string render_chat(const ChatFormat& format, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt) {
  return render_chat_marked(format, messages, add_generation_prompt).text;
}

RenderedChat render_chat_marked(const ChatFormat& format, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  RenderedChat rc;
  if (!format.jinja_source.empty()) {
    rc = render_jinja_chat(format.jinja_source, format.bos_token, format.eos_token, messages_json(messages),
                           add_generation_prompt, format.options, format.control_tokens);
    strip_leading_bos(rc, format);
    return rc;
  }
  switch (format.kind) {
    case ChatTemplate::Jinja: fail("chat template: the format has no template text");
    case ChatTemplate::KimiK3: render_kimi(format, messages, add_generation_prompt, rc); break;
    case ChatTemplate::MuseSpark:
      render_muse(format, messages, add_generation_prompt, rc);
      strip_leading_bos(rc, format);
      break;
    case ChatTemplate::Qwen38: render_qwen38(format, messages, add_generation_prompt, rc); break;
    case ChatTemplate::ChatML:
      render_chatml(format, messages, add_generation_prompt, rc);
      break;
    case ChatTemplate::Gemma:
      render_gemma(messages, add_generation_prompt, rc);
      break;
    case ChatTemplate::None:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i > 0) rc.text += '\n';
        rc.text += messages[i].content;
      }
      break;
  }
  return rc;
}

const char* chat_template_name(ChatTemplate kind) {
  switch (kind) {
    case ChatTemplate::ChatML: return "chatml";
    case ChatTemplate::Gemma: return "gemma";
    case ChatTemplate::None: return "none";
    case ChatTemplate::Jinja: return "jinja";
    case ChatTemplate::KimiK3: return "kimi-k3";
    case ChatTemplate::MuseSpark: return "muse-spark";
    case ChatTemplate::Qwen38: return "qwen3.8";
  }
  return "none";
}

RenderedChat render_jinja_chat(std::string_view source, const std::string& bos_token, const std::string& eos_token,
                               const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& extra, const std::vector<std::string>& control_tokens,
                               std::optional<int64_t> now_utc) {
  if (!messages.is_array()) fail("chat template: the messages must be an array, got {}", messages.type_name());
  if (!extra.is_null() && !extra.is_object())
    fail("chat template: the extra variables must be an object, got {}", extra.type_name());
  nlohmann::ordered_json data = extra.is_object() ? extra : nlohmann::ordered_json::object();
  data["messages"] = messages;
  data["add_generation_prompt"] = add_generation_prompt;
  const nlohmann::ordered_json trusted = {{"bos_token", bos_token}, {"eos_token", eos_token}};
  jinja::Rendered r = jinja::render(source, data, trusted, now_utc);
  RenderedChat rc;
  rc.markers = find_markers(r, control_tokens);
  rc.text = std::move(r.text);
  return rc;
}

ChatFormat jinja_chat_format(std::string source) {
  jinja::check_syntax(source);
  ChatFormat f;
  if (source.find("<|im_start|>") != std::string::npos) {
    f.kind = ChatTemplate::ChatML;
    f.default_system_prompt = extract_default_system_prompt(source);
  } else if (source.find("<start_of_turn>") != std::string::npos) {
    f.kind = ChatTemplate::Gemma;
  } else {
    f.kind = ChatTemplate::Jinja;
  }
  f.jinja_source = std::move(source);
  return f;
}

std::optional<ChatFormat> builtin_chat_format(std::string_view name) {
  if (name == "chatml") return ChatFormat::standard(ChatTemplate::ChatML);
  if (name == "gemma") return ChatFormat::standard(ChatTemplate::Gemma);
  if (name == "none") return ChatFormat::standard(ChatTemplate::None);
  ChatFormat f;
  if (name == "kimi-k3" || name == "kimi-k3-think") {
    f.kind = ChatTemplate::KimiK3;
    f.think = name == "kimi-k3-think";
    f.control_tokens = {kKimiOpen, kKimiClose, kKimiSep, kKimiEnd};
    return f;
  }
  if (name == "qwen3.8" || name == "qwen3.8-think") {
    f.kind = ChatTemplate::Qwen38;
    f.think = name == "qwen3.8-think";
    f.control_tokens = {"<|im_start|>", "<|im_end|>", "<think>", "</think>"};
    return f;
  }
  if (name.rfind("muse-spark", 0) == 0) {
    f.kind = ChatTemplate::MuseSpark;
    f.bos_token = kMuseBos;
    f.control_tokens = {kMuseBos, kMuseStart, kMuseMessage, kMuseEot, kMuseEom};
    const std::string_view rest = name.substr(std::string_view("muse-spark").size());
    if (rest.empty()) return f;
    if (rest[0] != '-' || muse_strength(std::string(rest.substr(1))) == 0) return std::nullopt;
    f.reasoning_effort = std::string(rest.substr(1));
    return f;
  }
  return std::nullopt;
}

std::string builtin_chat_format_names() {
  return "chatml, gemma, none, kimi-k3, kimi-k3-think, muse-spark, muse-spark-{minimal,low,medium,high,xhigh}, "
         "qwen3.8, qwen3.8-think";
}

ChatFormat chat_format_from_option(const std::string& name_or_file) {
  if (std::optional<ChatFormat> f = builtin_chat_format(name_or_file)) return *f;
  std::FILE* fp = std::fopen(name_or_file.c_str(), "rb");
  if (!fp)
    fail("--chat-template '{}' is neither a built-in format ({}) nor a readable template file",
         printable(name_or_file, 200), builtin_chat_format_names());
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, fp)) > 0) {
    text.append(buf, n);
    if (text.size() > (size_t{16} << 20)) {
      std::fclose(fp);
      fail("--chat-template '{}': the file is larger than 16 MiB", printable(name_or_file, 200));
    }
  }
  std::fclose(fp);
  // A JSON file holding {"chat_template": "..."} (tokenizer_config.json) also works.
  if (!text.empty() && text[0] == '{') {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string())
      text = j["chat_template"].get<std::string>();
  }
  try {
    return jinja_chat_format(std::move(text));
  } catch (const Error& e) {
    fail("--chat-template '{}': {}", printable(name_or_file, 200), e.what());
  }
}

void bind_chat_tokens(ChatFormat& format, const Tokenizer& tok) {
  format.encoder_adds_bos = tok.add_bos_default() && tok.bos_id() >= 0;
  if (format.kind == ChatTemplate::KimiK3 || format.kind == ChatTemplate::MuseSpark ||
      format.kind == ChatTemplate::Qwen38)
    return;  // their markers are fixed
  format.control_tokens.clear();
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (tok.is_special(id)) format.control_tokens.push_back(tok.token_text(id));
  if (format.bos_token.empty() && tok.bos_id() >= 0) format.bos_token = tok.token_text(tok.bos_id());
  if (format.eos_token.empty() && tok.eos_id() >= 0) format.eos_token = tok.token_text(tok.eos_id());
}

bool has_reasoning_channels(const ChatFormat& f) {
  switch (f.kind) {
    case ChatTemplate::KimiK3:
    case ChatTemplate::MuseSpark:
    case ChatTemplate::Qwen38: return true;
    default:
      return !f.jinja_source.empty() && (f.jinja_source.find("</think>") != std::string::npos ||
                                         f.jinja_source.find("<|channel|>") != std::string::npos);
  }
}

ReasoningSplit split_reasoning(const ChatFormat& f, std::string_view text) {
  ReasoningSplit r;
  if (f.kind == ChatTemplate::KimiK3) {
    std::string rest(text);
    const size_t sw = rest.find(kKimiChannelSwitch);
    if (sw != std::string::npos) {
      r.reasoning = rest.substr(0, sw);
      rest = rest.substr(sw + std::string_view(kKimiChannelSwitch).size());
    }
    r.content = replace_all(std::move(rest), kKimiResponseTail, "");
    return r;
  }
  if (f.kind == ChatTemplate::MuseSpark) {
    std::string reasoning;
    bool any = false;
    size_t at = 0;
    const std::string_view start = kMuseStart, message = kMuseMessage;
    while (at <= text.size()) {
      const size_t next = text.find(start, at);
      std::string_view seg = text.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at);
      if (seg.substr(0, 9) == "assistant") seg.remove_prefix(9);
      const size_t m = seg.find(message);
      if (m != std::string_view::npos) {
        std::string body = replace_all(replace_all(std::string(seg.substr(m + message.size())), kMuseEot, ""), kMuseEom, "");
        if (trim_ascii(seg.substr(0, m)) == "to=self") {
          reasoning += body;
          any = true;
        } else {
          r.content += body;
        }
      }
      if (next == std::string_view::npos) break;
      at = next + start.size();
    }
    if (any) r.reasoning = reasoning;
    return r;
  }
  if (f.kind == ChatTemplate::Qwen38) {
    const size_t close = text.find("</think>");
    if (close == std::string_view::npos) {
      r.content = std::string(text);
      return r;
    }
    r.reasoning = std::string(trim_ascii(text.substr(0, close)));
    r.content = std::string(trim_ascii(text.substr(close + 8)));
    return r;
  }
  if (f.jinja_source.find("<|channel|>") != std::string::npos && text.find("<|channel|>") != std::string_view::npos) {
    // gpt-oss harmony: <|channel|>NAME<|message|>BODY<|end|> ... ; analysis is the reasoning.
    std::string reasoning;
    bool any = false;
    const std::string_view ch = "<|channel|>", msg = "<|message|>";
    size_t at = text.find(ch);
    while (at != std::string_view::npos) {
      const size_t name_b = at + ch.size();
      const size_t m = text.find(msg, name_b);
      if (m == std::string_view::npos) break;
      const std::string_view name = trim_ascii(text.substr(name_b, m - name_b));
      const size_t body_b = m + msg.size();
      size_t body_e = text.size();
      for (std::string_view end : {"<|end|>", "<|return|>", "<|call|>", "<|start|>", "<|channel|>"})
        body_e = std::min(body_e, text.find(end, body_b) == std::string_view::npos ? text.size() : text.find(end, body_b));
      const std::string_view body = text.substr(body_b, body_e - body_b);
      if (name.substr(0, 8) == "analysis") {
        reasoning += body;
        any = true;
      } else {
        r.content += body;
      }
      at = text.find(ch, body_e);
    }
    if (any) r.reasoning = reasoning;
    return r;
  }
  if (has_reasoning_channels(f)) {
    // <think>...</think>, as Qwen3's and DeepSeek R1's templates read it back.
    const size_t close = text.find("</think>");
    if (close != std::string_view::npos) {
      std::string_view before = text.substr(0, close);
      const size_t open = before.rfind("<think>");
      if (open != std::string_view::npos) before = before.substr(open + 7);
      while (!before.empty() && before.front() == '\n') before.remove_prefix(1);
      while (!before.empty() && before.back() == '\n') before.remove_suffix(1);
      r.reasoning = std::string(before);
      std::string_view after = text.substr(text.rfind("</think>") + 8);
      while (!after.empty() && after.front() == '\n') after.remove_prefix(1);
      r.content = std::string(after);
      return r;
    }
  }
  r.content = std::string(text);
  return r;
}

}  // namespace megakern
