// libFuzzer target for the tokenizers: encoding arbitrary bytes must give
// token ids in range or raise megakern::Error (text that is not UTF-8), never
// crash; for the byte-level BPE vocabulary, decoding the ids of text encoded
// without special-token parsing must give the text back exactly; decoding
// arbitrary ids must not crash.
//
// Vocabularies: SmolLM2's (byte-level BPE) and Gemma 3's (SentencePiece)
// when models/ holds them (MEGAKERN_MODELS_DIR overrides the folder), and
// always the built-in byte vocabulary.
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
  auto& toks = vocabs().toks;
  const uint8_t ctl = data[0];
  const megakern::Tokenizer& tok = *toks[ctl % toks.size()];
  const bool parse_special = ctl & 0x10;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const std::vector<int32_t> ids = tok.encode(text, /*add_bos=*/false, parse_special);
    for (int32_t id : ids)
      if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
    const std::string back = tok.decode(ids, /*skip_special=*/false);
    if (!parse_special && tok.kind() == megakern::TokenizerKind::ByteLevelBPE && back != text) __builtin_trap();
  } catch (const megakern::Error&) {
  }
  // The same bytes as token ids.
  std::vector<int32_t> ids;
  for (size_t i = 1; i + 4 <= size; i += 4) {
    uint32_t v;
    __builtin_memcpy(&v, data + i, 4);
    ids.push_back(static_cast<int32_t>(v % static_cast<uint32_t>(tok.n_vocab())));
  }
  (void)tok.decode(ids, ctl & 0x20);
  return 0;
}
