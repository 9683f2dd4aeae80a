// Tokenizers of Hugging Face checkpoint directories.
//
// Reads `tokenizer.json` (a byte-level BPE model: vocab, merges in the
// "left right" or ["left", "right"] form, added tokens), `tokenizer_config.json`
// (bos_token, eos_token, add_bos_token, chat_template) and
// `generation_config.json` (eos_token_id, one id or a list) into the same Vocab
// the GGUF path fills, so both give the same Tokenizer.
//
// The pre-tokenizer is not interpreted: it is recognised as one of the recipes
// the GGUF path names (tokenizer/pretokenizer.h) and refused otherwise:
//  - ByteLevel with use_regex (GPT-2's split)                       -> "gpt2"
//  - Sequence[Digits(individual_digits), ByteLevel(use_regex)]      -> "smollm"
//  - Sequence[Split(Regex <Llama 3 split>, Isolated), ByteLevel]    -> "llama3"
//  - Sequence[Split(Regex <Qwen 2 split>, Isolated), ByteLevel]     -> "qwen2"
// A normalizer, a prefix space, dropout, byte fallback, a word prefix or suffix,
// or an ignore_merges flag that disagrees with the recipe are refused too.
// Added tokens marked `special` become control tokens, the others
// user-defined ones.
//
// A directory without tokenizer.json but with `tiktoken.model` (the Kimi
// checkpoints) is read as their published loader reads it
// (tokenizer/tiktoken.h): the rank file, the pat_str declaration of class
// TikTokenTokenizer in the tokenizer source (tokenization_kimi.py, or the
// module tokenizer_config.json's auto_map names), and 256 special ids after
// the ranks, named by tokenizer_config.json's added_tokens_decoder or
// "<|reserved_token_{id}|>"; bos_token / eos_token default to [BOS] / [EOS].
// chat_template.jinja and generation_config.json are read as above.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tokenizer/tokenizer.h"

namespace megakern {

struct HFTokenizerFiles {
  Vocab vocab;
  // The chat template (tokenizer_config.json's chat_template, or the
  // directory's chat_template.jinja); absent when neither gives one.
  std::optional<std::string> chat_template;
};

// Whether `dir` holds a tokenizer.json or a tiktoken.model.
bool has_hf_tokenizer(const std::string& dir);

// Reads the tokenizer files of `dir`; tokenizer.json (or tiktoken.model with
// tokenizer_config.json and the tokenizer source) is required, the other
// config files are optional. Throws megakern::Error naming the file and the
// field on anything missing, malformed or unsupported.
HFTokenizerFiles load_hf_tokenizer_files(const std::string& dir);

// load_hf_tokenizer_files, then the Tokenizer of its vocabulary.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& dir, std::optional<std::string>* chat_template = nullptr);

}  // namespace megakern
