// libFuzzer target for chat-template rendering and its encoding: arbitrary
// messages (roles and contents of any bytes) rendered in every template must
// give markers that lie in order inside the text and spell the template's
// control tokens, and encoding the result must produce no more control
// tokens than the template wrote (message text never becomes one).
//
// Input: byte 0 picks the template and vocabulary; the rest is split at 0x1E
// into messages, whose first byte picks the role.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Vocabs {
  std::vector<std::unique_ptr<megakern::GGUFFile>> files;
  std::vector<std::unique_ptr<megakern::Tokenizer>> toks;
};

Vocabs& vocabs() {
  static Vocabs v = [] {
    Vocabs out;
    const char* env = std::getenv("MEGAKERN_MODELS_DIR");
    const std::string dir = env ? env : "models";
    for (const char* m : {"smollm2-135m.gguf", "gemma3-270m.gguf"}) {
      const std::string path = dir + "/" + m;
      if (!std::filesystem::is_regular_file(path)) continue;
      out.files.push_back(megakern::GGUFFile::open(path));
      out.toks.push_back(megakern::Tokenizer::from_gguf(*out.files.back()));
    }
    out.toks.push_back(std::make_unique<megakern::Tokenizer>(megakern::byte_vocab(512)));
    return out;
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t ctl = data[0];
  const megakern::ChatTemplate kinds[] = {megakern::ChatTemplate::ChatML, megakern::ChatTemplate::Gemma,
                                          megakern::ChatTemplate::None};
  megakern::ChatFormat format = megakern::ChatFormat::standard(kinds[ctl % 3]);
  if (ctl & 0x80) format.default_system_prompt.reset();
  const auto& toks = vocabs().toks;
  const megakern::Tokenizer& tok = *toks[(ctl >> 2) % toks.size()];

  std::vector<megakern::ChatMessage> msgs;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  static const char* const roles[] = {"system", "user", "assistant"};
  size_t at = 0;
  while (at <= rest.size() && msgs.size() < 64) {
    size_t end = rest.find('\x1e', at);
    if (end == std::string_view::npos) end = rest.size();
    const std::string_view m = rest.substr(at, end - at);
    megakern::ChatMessage cm;
    cm.role = roles[m.empty() ? 1 : static_cast<uint8_t>(m[0]) % 3];
    if (!m.empty()) cm.content = std::string(m.substr(1));
    msgs.push_back(std::move(cm));
    at = end + 1;
  }

  const megakern::RenderedChat rc = megakern::render_chat_marked(format, msgs, ctl & 0x40);
  if (rc.text != megakern::render_chat(format, msgs, ctl & 0x40)) __builtin_trap();
  size_t prev = 0;
  for (const auto& [b, e] : rc.markers) {
    if (b < prev || e <= b || e > rc.text.size()) __builtin_trap();
    const std::string_view mk = std::string_view(rc.text).substr(b, e - b);
    if (mk != "<|im_start|>" && mk != "<|im_end|>" && mk != "<start_of_turn>" && mk != "<end_of_turn>")
      __builtin_trap();
    prev = e;
  }
  try {
    const std::vector<int32_t> ids = tok.encode_marked(rc.text, rc.markers, /*add_bos=*/false);
    size_t control = 0;
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
      control += tok.token_type(id) == megakern::TokenType::Control;
    }
    if (control > rc.markers.size()) __builtin_trap();
  } catch (const megakern::Error&) {
    // Contents that are not UTF-8 are refused.
  }
  return 0;
}
