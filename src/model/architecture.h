// The architectures the engine runs, behind one interface, and their registry.
//
// An Architecture knows its presets (named configurations), which checkpoints
// it reads (a Hugging Face config.json `model_type`, a GGUF
// `general.architecture`), and how to make a model of it: from a preset's
// deterministic synthetic weights, or by loading a checkpoint. The model it
// makes (ArchModel) builds its DecodeProgram and can be written back to disk.
// The runtime (runtime/model.h) and the commands (gen-model, inspect) walk
// architectures(), so adding an architecture is its own source files plus one
// line in the registry (model/architecture.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/numerics.h"
#include "ir/sequence_state.h"
#include "ir/program.h"

namespace megakern {

class GGUFFile;

struct ModelOptions {
  // Convert every weight matrix to this format at load (checkpoint
  // directories and synthetic presets; GGUF files and dense presets keep
  // their formats, or are dequantised to f32 when this is F32).
  // For MoE presets: this is the dense format, and `experts` the routed
  // experts' (defaults bf16 and int4_g128 for Muse Spark).
  std::optional<DType> weights;
  std::optional<DType> experts;
  uint64_t seed = 1;  // synthetic presets
  Numerics numerics = Numerics::Exact;  // activation quantisation (core/numerics.h)
  KvType kv_type = KvType::f32;         // element type of the KV cache (core/kv_type.h)
};

// A model of some architecture, as loaded or generated.
class ArchModel {
 public:
  virtual ~ArchModel();
  // The decode program for steps of up to max_rows rows (Numerics::Exact;
  // the runtime sets the mode).
  virtual DecodeProgram build_program(int max_rows) const = 0;
  // The most rows build_program accepts.
  virtual int max_program_rows() const { return 64; }
  virtual int n_vocab() const = 0;
  // The longest context the model was trained for (0 when unknown).
  virtual int train_context() const { return 0; }
  // One line: architecture, sizes, weight formats, bytes read per step.
  virtual std::string description() const = 0;
  // make_sequence_state's ring_block for this model's sequences (0: every
  // attention layer keeps all positions).
  virtual int ring_block() const { return 0; }
  // The GGUF file the model reads (its tokenizer and chat template), or null.
  virtual const GGUFFile* gguf() const { return nullptr; }
};

// What `megakern gen-model` asks of an architecture.
struct GenOptions {
  uint64_t seed = 1;
  std::optional<DType> weights, experts;  // as given on the command line
  std::string layout = "ours";            // or "reference": the published reference's layout
};

class Architecture {
 public:
  virtual ~Architecture();
  // A short name ("qwen3.8").
  virtual std::string name() const = 0;
  // Every preset name, and whether a preset can be generated here (the
  // full-size configurations can only be described).
  virtual std::vector<std::string> presets() const = 0;
  virtual bool runnable(const std::string& preset) const { (void)preset; return true; }
  bool has_preset(const std::string& preset) const;
  // Hugging Face `model_type` values / GGUF `general.architecture` values it
  // reads (the first of each is the one it writes).
  virtual std::vector<std::string> hf_model_types() const { return {}; }
  virtual std::vector<std::string> gguf_architectures() const { return {}; }

  // A preset's deterministic synthetic weights, in memory. Throws
  // megakern::Error for a full-size preset or options it does not take.
  virtual std::unique_ptr<ArchModel> synthetic(const std::string& preset, const ModelOptions& o) const = 0;
  // A checkpoint directory (config.json + safetensors) of one of
  // hf_model_types().
  virtual std::unique_ptr<ArchModel> load_dir(const std::string& dir, const ModelOptions& o) const;
  // A parsed GGUF file of one of gguf_architectures(); the model keeps it.
  virtual std::unique_ptr<ArchModel> load_gguf(std::unique_ptr<GGUFFile> file, const ModelOptions& o) const;
  // `megakern gen-model`: writes the preset's synthetic checkpoint to dir.
  virtual void generate(const std::string& preset, const GenOptions& o, const std::string& dir) const;
  // `megakern inspect --config`: parameters, weights read per step, state.
  virtual std::string describe(const std::string& preset) const = 0;
  // `megakern inspect --schedule`: a model of the preset with shapes but no
  // weight memory (its program can be built and scheduled, not run), or
  // null when the architecture has no such form.
  virtual std::unique_ptr<ArchModel> shapes_only(const std::string& preset) const;
  // Whether generate() takes GenOptions::layout "reference".
  virtual bool writes_reference_layout() const { return false; }
};

// The registry, in the order names are matched and listed.
const std::vector<const Architecture*>& architectures();
// The architecture with this preset / HF model_type / GGUF architecture, or null.
const Architecture* architecture_of_preset(const std::string& preset);
const Architecture* architecture_of_hf(const std::string& model_type);
const Architecture* architecture_of_gguf(const std::string& general_architecture);
// Every preset name (runnable ones only when asked), comma separated lists.
std::vector<std::string> all_presets(bool runnable_only);
std::string join_names(const std::vector<std::string>& names);

// Throws the error for a full-size preset that cannot be generated here.
[[noreturn]] void fail_full_size(const std::string& preset, double gb);

}  // namespace megakern
