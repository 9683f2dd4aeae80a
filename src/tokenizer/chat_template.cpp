#include "tokenizer/chat_template.h"

#include <string_view>

#include "io/gguf.h"
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

}  // namespace

ChatFormat ChatFormat::standard(ChatTemplate kind) {
  ChatFormat f;
  f.kind = kind;
  if (kind == ChatTemplate::ChatML) f.default_system_prompt = kSmolLM2DefaultSystemPrompt;
  return f;
}

ChatFormat chat_format_from_template(const std::string& tmpl) {
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
  if (tmpl) {
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
  switch (format.kind) {
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
  }
  return "none";
}

}  // namespace megakern
