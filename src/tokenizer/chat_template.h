// Chat templates: turning a conversation into the prompt text a model was
// trained on.
//
// The rendered text never contains BOS. Encode it with
//   tokenizer.encode(text, /*add_bos=*/tokenizer.add_bos_default(), /*parse_special=*/true)
// so that BOS is added exactly when the model wants it (Gemma: yes, SmolLM2:
// no) and the control tokens in the text ("<|im_start|>", "<start_of_turn>")
// become their ids. (Gemma's own Jinja template writes "<bos>" as text; leaving
// it to encode() avoids a doubled BOS.)
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace megakern {

class GGUFFile;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (other roles are passed through)
  std::string content;
};

enum class ChatTemplate {
  ChatML,  // <|im_start|>role\ncontent<|im_end|>\n ... (SmolLM2, Qwen)
  Gemma,   // <start_of_turn>user\n...<end_of_turn>\n ... (Gemma 1/2/3)
  None,    // no chat format: the contents joined by newlines
};

// A template kind plus the details a particular model's template adds.
struct ChatFormat {
  ChatTemplate kind = ChatTemplate::None;
  // ChatML: a system turn inserted before the first message when the
  // conversation does not start with one (SmolLM2's template does this).
  std::optional<std::string> default_system_prompt;

  // The format render_chat(ChatTemplate, ...) uses. For ChatML that is
  // SmolLM2's: its default system prompt is included.
  static ChatFormat standard(ChatTemplate kind);
};

// SmolLM2-Instruct's built-in system prompt.
extern const char* const kSmolLM2DefaultSystemPrompt;

// Picks the template from `tokenizer.chat_template` ("<|im_start|>" means
// ChatML, "<start_of_turn>" Gemma), falling back to `general.architecture`
// (gemma*) and then to the vocabulary ("<|im_start|>" token present); None
// when nothing matches.
ChatTemplate detect_chat_template(const GGUFFile& file);
// As detect_chat_template, and also extracts a ChatML default system prompt
// from the template text when the template inserts one.
ChatFormat detect_chat_format(const GGUFFile& file);
// The format a chat template's text names ("<|im_start|>": ChatML with its
// default system prompt, "<start_of_turn>": Gemma), None otherwise.
ChatFormat chat_format_from_template(const std::string& tmpl);

// Renders the conversation; with add_generation_prompt the text ends with the
// opening of an assistant turn for the model to complete.
//  - ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, contents
//    verbatim; the default system turn first if the first message is not a
//    system message (and there is at least one message).
//  - Gemma: "<start_of_turn>{role}\n{content}<end_of_turn>\n" with "assistant"
//    spelled "model" and contents trimmed of surrounding whitespace; a leading
//    system message is not a turn of its own but is written, followed by a
//    blank line, at the start of the first remaining turn (as Gemma's template
//    does; a conversation holding only a system message renders without it).
//    Unlike the Jinja template, roles that do not alternate are accepted.
//  - None: the contents joined with "\n"; add_generation_prompt is ignored.
std::string render_chat(ChatTemplate kind, const std::vector<ChatMessage>& messages, bool add_generation_prompt);
std::string render_chat(const ChatFormat& format, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt);

// The rendered text with the byte ranges of the template's own control
// markers ("<|im_start|>", "<end_of_turn>", ...), in order. Encode it with
// Tokenizer::encode_marked so that only those become control tokens: message
// contents are text, whatever they spell.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> markers;
};
RenderedChat render_chat_marked(const ChatFormat& format, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);

const char* chat_template_name(ChatTemplate kind);  // "chatml", "gemma", "none"

}  // namespace megakern
