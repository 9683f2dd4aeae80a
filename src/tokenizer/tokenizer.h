// Tokenizers built from GGUF metadata, and an incremental detokenizer.
//
// Two algorithms are supported, selected by `tokenizer.ggml.model`:
//
//  - "gpt2": byte-level BPE (SmolLM2, Llama 3, Qwen 2, ...). Text is split by
//    the pre-tokenizer regexes named by `tokenizer.ggml.pre`, each piece's bytes
//    are spelled in GPT-2's byte alphabet, and the ranked merges from
//    `tokenizer.ggml.merges` are applied lowest rank first (leftmost first on
//    ties), exactly like the Hugging Face `tokenizers` BPE model.
//
//  - "llama": SentencePiece BPE (Gemma 3, Llama 2, ...). Spaces become "▁"
//    (U+2581), an optional "▁" is prepended (`add_space_prefix`), and adjacent
//    pieces are merged highest score first (leftmost first on ties) as long as
//    the merged string is a vocabulary piece. Characters that end up in no piece
//    fall back to their UTF-8 bytes as "<0xXX>" tokens, or to UNK. This is the
//    algorithm of the SentencePiece library's BPE model; merges stored in the
//    GGUF are not needed by it and are ignored, as is tokenizer.ggml.pre.
//    Merges only produce NORMAL, USER_DEFINED or untyped pieces; SentencePiece also
//    passes through UNUSED pieces and splits them again afterwards, which no
//    supported vocabulary needs (Gemma 3 has no UNUSED tokens).
//
// Tokens typed USER_DEFINED are always matched whole in the input (before the
// BPE step), and CONTROL/UNKNOWN tokens such as "<|im_start|>" are matched only
// when encode() is asked to parse special tokens. In both cases the leftmost,
// then longest, match wins.
//
// Thread safety: a Tokenizer is immutable after construction; encode() and
// decode() may be called concurrently from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megakern {

class GGUFFile;

enum class TokenizerKind {
  ByteLevelBPE,      // tokenizer.ggml.model == "gpt2"
  SentencePieceBPE,  // tokenizer.ggml.model == "llama"
};

// Token attributes, numbered as GGUF's tokenizer.ggml.token_type stores them.
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

// Everything a tokenizer is made of, as plain data. from_gguf() fills one from
// metadata; tests build small ones by hand. Ids of -1 mean "absent".
struct Vocab {
  TokenizerKind kind = TokenizerKind::ByteLevelBPE;
  // Pre-tokenizer name (tokenizer.ggml.pre); only used by byte-level BPE.
  // Supported: "gpt2", "default", "smollm", "starcoder", "refact", "llama3",
  // "llama-bpe", "llama-v3", "qwen2", "deepseek-r1-qwen".
  std::string pre = "gpt2";
  std::vector<std::string> tokens;
  std::vector<float> scores;        // empty, or one per token (required for SentencePiece)
  std::vector<TokenType> types;     // empty (every token Normal), or one per token
  std::vector<std::string> merges;  // byte-level BPE only: "left right", best first
  // Byte-level BPE only: the rank of each merge (lower merges first, the
  // leftmost pair on ties), one per merge; when empty a merge's rank is its
  // position. tiktoken vocabularies give every split of a token that token's rank.
  std::vector<int32_t> merge_ranks;
  // Byte-level BPE only: PCRE2 split patterns used instead of the named
  // pre-tokenizer `pre` when not empty, each refining the previous split; with
  // pre_ignore_merges a piece that is a token is taken whole.
  std::vector<std::string> pre_patterns;
  bool pre_ignore_merges = false;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t eot_id = -1;  // end of turn (tokenizer.ggml.eot_token_id)
  int32_t eom_id = -1;  // end of message (tokenizer.ggml.eom_token_id)
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  std::vector<int32_t> extra_eog_ids;  // further end-of-generation tokens
  bool add_bos = false;
  bool add_space_prefix = false;  // SentencePiece only: prepend "▁" to the text
};

// A byte vocabulary for models without a tokenizer of their own (the
// synthetic presets): token b < 256 is the single byte b (spelled in the
// byte-level alphabet, no merges, so every byte of the text becomes its own
// token), ids 256..n_vocab-1 are control tokens "<|reserved_N|>", and the last
// one, when n_vocab > 256, is the end-of-text token. n_vocab must be >= 256.
Vocab byte_vocab(int32_t n_vocab);

class Tokenizer {
 public:
  // Validates `vocab` and builds the lookup tables; throws megakern::Error on
  // malformed input (sizes that disagree, ids out of range, bad merges, an
  // unsupported pre-tokenizer, ...).
  explicit Tokenizer(Vocab vocab);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Reads the tokenizer.* metadata of a GGUF file; throws megakern::Error
  // naming the file and the key on missing or malformed metadata.
  static std::unique_ptr<Tokenizer> from_gguf(const GGUFFile& file);
  // Fills a Vocab from GGUF metadata without building the tokenizer.
  static Vocab vocab_from_gguf(const GGUFFile& file);

  // Encodes UTF-8 text. With add_bos the BOS token is prepended (an error if
  // the vocabulary has none). With parse_special, control tokens written in the
  // text ("<|im_start|>", "<start_of_turn>") become their ids; without it they
  // are tokenized as ordinary text. Throws megakern::Error if `text` is not
  // valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;
  // Encodes text in which only the given byte ranges may become control
  // tokens: each range that spells one control token exactly becomes its id,
  // and everything else is tokenized as ordinary text (user-defined tokens
  // still match). For chat prompts, the ranges are the template's own turn
  // markers, so that "<|im_end|>" typed in a message stays text. For benign
  // text the result equals encode(text, add_bos, /*parse_special=*/true).
  // Ranges must be sorted, disjoint and inside `text`.
  std::vector<int32_t> encode_marked(std::string_view text, const std::vector<std::pair<size_t, size_t>>& markers,
                                     bool add_bos) const;

  // The raw bytes a token stands for: byte-level tokens mapped back through the
  // GPT-2 byte table, "▁" turned into a space, "<0xAB>" byte tokens turned into
  // that byte, control tokens as their text. Throws on an id out of range.
  const std::string& token_bytes(int32_t id) const;
  // The vocabulary string of a token, as stored in the GGUF.
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;

  // Concatenates token_bytes() of `ids`. With skip_special, control and unknown
  // tokens (BOS, EOS, "<|im_end|>", ...) are left out. A leading space that
  // encode() added as a prefix (add_space_prefix) is removed again. The result
  // may end in an incomplete UTF-8 sequence if the ids do.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const;

  int32_t n_vocab() const;
  int32_t bos_id() const;  // -1 if the vocabulary has none
  int32_t eos_id() const;  // -1 if the vocabulary has none
  bool add_bos_default() const;
  bool add_space_prefix() const;
  TokenizerKind kind() const;

  // True for tokens that end generation: EOS, EOT, EOM, the ids listed in
  // Vocab::extra_eog_ids, and control tokens with a well-known end-of-turn
  // spelling ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", ...).
  bool is_end_of_generation(int32_t id) const;
  // True for tokens decode(..., skip_special=true) leaves out.
  bool is_special(int32_t id) const;

  // Exact lookup of a vocabulary string.
  std::optional<int32_t> find_token(std::string_view piece) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text piece by piece without ever splitting a
// multi-byte UTF-8 character: push() returns the bytes that are complete so far
// and holds back a trailing, still-incomplete sequence until later tokens
// finish it. Bytes that can never become valid UTF-8 are passed through rather
// than held forever. Not thread-safe; use one per generated sequence.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true);

  std::string push(int32_t id);
  // Returns whatever is still held back (possibly an incomplete sequence) and
  // resets the decoder for a new stream.
  std::string flush();
  // Bytes currently held back.
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool at_start_ = true;  // no text emitted yet: the space-prefix rule applies
  std::string pending_;
};

}  // namespace megakern
