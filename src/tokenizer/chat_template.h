// Chat templates: turning a conversation into the prompt text a model was
// trained on.
//
// The rendered text never contains a BOS that the encoder adds itself. Encode it with
//   tokenizer.encode(text, /*add_bos=*/tokenizer.add_bos_default(), /*parse_special=*/true)
// so that BOS is added exactly when the model wants it (Gemma: yes, SmolLM2:
// no) and the control tokens in the text ("<|im_start|>", "<start_of_turn>")
// become their ids. (Gemma's own Jinja template writes "<bos>" as text; leaving
// it to encode() avoids a doubled BOS.)
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megakern {

class GGUFFile;
class Tokenizer;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (other roles are passed through)
  std::string content;
};

enum class ChatTemplate {
  ChatML,  // <|im_start|>role\ncontent<|im_end|>\n ... (SmolLM2, Qwen)
  Gemma,   // <start_of_turn>user\n...<end_of_turn>\n ... (Gemma 1/2/3)
  None,    // no chat format: the contents joined by newlines
  Jinja,   // the model's own Jinja template (ChatFormat::jinja_source)
  // The reference architectures' formats, as their published code renders them.
  KimiK3,     // <|open|>message role="user"<|sep|>...<|close|>message<|sep|><|end_of_msg|>, think / response channels
  MuseSpark,  // <|start|>user<|message|>...<|eot|>, reasoning "to=self" segments, a reasoning strength
  Qwen38,     // ChatML with a <think> scaffold on assistant turns
};

// A template kind plus the details a particular model's template adds.
struct ChatFormat {
  ChatTemplate kind = ChatTemplate::None;
  // ChatML: a system turn inserted before the first message when the
  // conversation does not start with one (SmolLM2's template does this).
  std::optional<std::string> default_system_prompt;

  // A Jinja template, rendered whenever it is set (whatever `kind` says;
  // `kind` then names the family it looks like, or Jinja).
  std::string jinja_source;
  std::string bos_token, eos_token;  // the template's bos_token / eos_token
  // The encoder adds BOS (Tokenizer::add_bos_default): a BOS the template
  // writes first is then left out of the rendered text.
  bool encoder_adds_bos = false;
  // Texts of the tokenizer's control tokens: where the template itself writes
  // one, it is marked for encode_marked (see render_chat_marked).
  std::vector<std::string> control_tokens;
  // Extra template variables (enable_thinking, reasoning_effort, ...).
  nlohmann::ordered_json options = nlohmann::ordered_json::object();
  // Built-in reasoning formats: open the reasoning channel in the generation
  // prompt (KimiK3 "think" mode, Qwen38 "<think>\n"); otherwise the answer.
  bool think = false;
  // MuseSpark: minimal, low, medium, high or xhigh.
  std::string reasoning_effort = "medium";

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

const char* chat_template_name(ChatTemplate kind);  // "chatml", "gemma", "none", "jinja", "kimi-k3", ...

// Renders a Jinja chat template exactly as transformers' apply_chat_template
// does (the text is not stripped of a BOS the template writes): `messages`
// is an array of message objects, `extra` an object of further variables
// (tools, enable_thinking, ...). The markers are the control tokens among
// `control_tokens` that the template itself writes; text that comes from
// `messages` or `extra` is never marked. Throws megakern::Error naming the
// construct and its position when the template cannot be rendered.
// strftime_now() reads the clock, or formats `now_utc` (seconds since the
// epoch, in UTC) when given.
RenderedChat render_jinja_chat(std::string_view source, const std::string& bos_token, const std::string& eos_token,
                               const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& extra, const std::vector<std::string>& control_tokens,
                               std::optional<int64_t> now_utc = std::nullopt);

// A format from a Jinja template text (checked to parse; throws
// megakern::Error otherwise); `kind` is ChatML or Gemma when the template
// looks like one, else Jinja.
ChatFormat jinja_chat_format(std::string source);

// The built-in formats by name: chatml, gemma, none, kimi-k3, kimi-k3-think,
// muse-spark (muse-spark-minimal / -low / -medium / -high / -xhigh),
// qwen3.8, qwen3.8-think. nullopt for any other name.
std::optional<ChatFormat> builtin_chat_format(std::string_view name);
// The names builtin_chat_format knows, comma separated (for messages).
std::string builtin_chat_format_names();

// Resolves --chat-template: a built-in name, else a file holding a Jinja
// template. Throws megakern::Error naming the value when it is neither, or
// when the file does not parse.
ChatFormat chat_format_from_option(const std::string& name_or_file);

// Fills control_tokens (the tokenizer's control tokens; built-in formats keep
// their own), encoder_adds_bos and, where unset, bos_token / eos_token from
// the tokenizer.
void bind_chat_tokens(ChatFormat& format, const Tokenizer& tokenizer);

// A generated assistant text split into its reasoning and its answer, as the
// format's reasoning channels mark them: <think>...</think> (Qwen3, Qwen38,
// DeepSeek R1 and other Jinja templates that write "<think>"), gpt-oss's
// analysis / final channels, KimiK3's think / response channels, MuseSpark's
// "to=self" segments. `reasoning` is nullopt when the text has none.
struct ReasoningSplit {
  std::optional<std::string> reasoning;
  std::string content;
};
ReasoningSplit split_reasoning(const ChatFormat& format, std::string_view generated);
// Whether the format has reasoning channels that split_reasoning separates.
bool has_reasoning_channels(const ChatFormat& format);

}  // namespace megakern
