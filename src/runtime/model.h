// A model as the runtime drives it, whatever its architecture: the builder of
// its DecodeProgram, the per-sequence state its rows need, a tokenizer and a
// chat format. Commands, the server and speculative decoding see only this.
//
// load_model() accepts
//  - a GGUF file or the name of a fetched model ("smollm2-135m"): a dense
//    transformer (llama, qwen3, gemma3) with its own tokenizer;
//  - a dense bench preset ("dense-bench", "dense-mini"), generated in memory;
//  - a Hugging Face checkpoint directory (config.json + safetensors) of a
//    supported architecture (Qwen3.5 / Qwen3.8 "qwen3_5_text", Kimi K3
//    "kimi_k3" and Muse Spark "muse_spark" as their save() writes them);
//  - a synthetic architecture preset ("qwen3.8-mini", "qwen3.8-bench",
//    "kimi-k3-mini", "kimi-k3-bench", "muse-spark-mini", "muse-spark-bench"):
//    the deterministic weights `megakern gen-model` writes, built in memory.
// A checkpoint directory with a tokenizer.json uses it (tokenizer/hf_tokenizer.h).
// Models without a tokenizer of their own (presets, checkpoint directories
// without tokenizer files) use the byte vocabulary of byte_vocab(): one token
// per byte.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/numerics.h"
#include "exec/executor.h"
#include "ir/sequence_state.h"
#include "ir/program.h"
#include "kernels/cpu/repack.h"
#include "model/architecture.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace megakern {

class ThreadPool;

class Model {
 public:
  // The runtime's side of an architecture's model (model/architecture.h):
  // its tokenizer (the GGUF file's own, a checkpoint directory's
  // tokenizer.json, or the byte tokenizer) and chat format. Throws
  // megakern::Error when the model has no usable tokenizer.
  Model(const std::string& name, std::unique_ptr<ArchModel> arch);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  // The name it was loaded by, and a one-line description (architecture,
  // sizes, weight format).
  const std::string& name() const { return name_; }
  const std::string& description() const { return description_; }
  int n_vocab() const { return n_vocab_; }
  // The longest context the model was trained for (0 when unknown).
  int train_context() const { return train_ctx_; }
  // Whether rows carry recurrent state (a sequence's state cannot be rewound).
  bool recurrent() const { return shape_.recurrent; }
  // The most rows a program of this model can be built for.
  int max_program_rows() const { return max_program_rows_; }

  // The model's decode program for steps of up to max_rows rows, in the
  // model's numerics mode.
  // Its matrix products read the weights repacked for the host's kernels
  // where it has them (kernels/cpu/repack.h), one copy per matrix kept by
  // the model.
  DecodeProgram build_program(int max_rows) const;
  // A rewrite applied to every program this model builds from now on, before
  // the repacking (a tensor-parallel rank's part of the program,
  // dist/tensor_parallel.h); the shape of new sequences follows it.
  using ProgramTransform = std::function<DecodeProgram(const DecodeProgram&)>;
  void set_program_transform(ProgramTransform t) {
    transform_ = std::move(t);
    set_sequence_shape(ring_block_);
  }
  bool has_program_transform() const { return static_cast<bool>(transform_); }
  // Bytes of the repacked copies made so far.
  size_t packed_weight_bytes() const;
  // Whether programs built from now on read repacked weights (default: yes,
  // where the host has kernels for them; the results are the same bits).
  void set_repack_weights(bool on) { repack_ = on; }
  // Whether that includes the exact mode's programs (repack_exact_by_default:
  // MEGAKERN_REPACK=all; the fast mode packs by default).
  void set_repack_exact(bool on) { repack_exact_ = on; }
  // How activations meet quantised weights (ModelOptions::numerics); every
  // program and prompt pass of this model uses it.
  Numerics numerics() const { return numerics_; }
  void set_numerics(Numerics n) { numerics_ = n; }
  // The zeroed state of a new sequence of up to n_ctx positions, shaped by
  // the model's program (ir/sequence_state.h).
  SequenceState new_sequence(int n_ctx) const { return make_sequence_state(shape_, n_ctx, ring_block_, kv_type_); }
  // The element type of new sequences' KV caches (ModelOptions::kv_type).
  // Throws megakern::Error when the model's cache cannot store it (q8_0 and
  // a head width not a multiple of 32), naming the layer and width.
  KvType kv_type() const { return kv_type_; }
  void set_kv_type(KvType t) {
    check_kv_type(shape_, t);
    kv_type_ = t;
  }
  // Throws megakern::Error for a model with no tokenizer (no tokenizer of its
  // own and a vocabulary too small for the byte tokenizer), naming why.
  const Tokenizer& tokenizer() const;
  // The chat format, and whether the model declares one itself (a GGUF
  // chat template) rather than having it inferred from the architecture.
  const ChatFormat& chat_format() const { return chat_; }
  bool declares_chat_template() const { return chat_declared_; }
  // Replaces the chat format (--chat-template), binding it to this model's
  // control tokens.
  void set_chat_format(ChatFormat f);

 private:
  DecodeProgram build_program_for(int max_rows) const { return arch_->build_program(max_rows); }
  // Sets the shape of new sequences from the model's program; ring_block > 0
  // makes windowed attention layers rings (make_sequence_state).
  void set_sequence_shape(int ring_block = 0) {
    shape_ = sequence_shape(transformed(build_program_for(1)));
    ring_block_ = ring_block;
  }

  std::unique_ptr<ArchModel> arch_;
  std::string name_, description_, no_tokenizer_;
  int n_vocab_ = 0;
  int train_ctx_ = 0;
  int max_program_rows_ = 64;
  std::unique_ptr<Tokenizer> tokenizer_;  // null when no_tokenizer_ says why
  ChatFormat chat_;
  bool chat_declared_ = false;
  Numerics numerics_ = Numerics::Exact;
  KvType kv_type_ = KvType::f32;
  SequenceShape shape_;
  int ring_block_ = 0;
  std::shared_ptr<PackedWeights> packed_ = std::make_shared<PackedWeights>();
  bool repack_ = true;
  bool repack_exact_ = repack_exact_by_default();
  ProgramTransform transform_;
  DecodeProgram transformed(DecodeProgram p) const { return transform_ ? transform_(p) : p; }
};

// Throws megakern::Error naming what could not be found or read.
std::unique_ptr<Model> load_model(const std::string& name_or_path, const ModelOptions& opts = {});
// A parsed GGUF file (an image in memory, for instance) as load_model reads
// a file of that name; the model keeps the file.
std::unique_ptr<Model> load_model(std::unique_ptr<GGUFFile> file, const ModelOptions& opts = {});

// Names load_model() knows without a path: fetched models, then presets.
std::vector<std::string> known_model_and_preset_names();

}  // namespace megakern
