#include "runtime/model.h"

#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "model/dense_program.h"
#include "model/presets.h"
#include "model/kimi.h"
#include "model/kimi_config.h"
#include "model/muse.h"
#include "model/muse_config.h"
#include "model/qwen38.h"
#include "model/qwen38_config.h"
#include "runtime/session.h"

namespace megakern {

Model::~Model() = default;

bool Model::prompt_forward(ThreadPool&, SequenceState&, const int32_t*, int, int, float*) const { return false; }
bool Model::prompt_forward_logits(ThreadPool&, SequenceState&, const int32_t*, int, int, int, float*) const {
  return false;
}

namespace {

std::unique_ptr<Tokenizer> byte_tokenizer(int n_vocab, const std::string& model) {
  if (n_vocab < 256)
    fail("model '{}' has no tokenizer of its own and a vocabulary of {} tokens, too small for the byte tokenizer "
         "(256 needed)",
         model, n_vocab);
  return std::make_unique<Tokenizer>(byte_vocab(n_vocab));
}

// Dense transformers from GGUF (files, fetched models, bench presets).
class DenseRuntimeModel final : public Model {
 public:
  // `weights`: for a preset, the matrix format it is generated in (its f32
  // weights quantised into it at load); for a GGUF file only f32, every
  // matrix dequantised at load (the f32 computation of the same weights).
  explicit DenseRuntimeModel(const std::string& name_or_path, std::optional<DType> weights = std::nullopt) {
    name_ = name_or_path;
    std::optional<DType> dequantise = weights;  // GGUF files: f32 at load
    if (const DensePreset* p = find_dense_preset(name_or_path)) {
      DensePreset q = *p;
      if (weights) q.wtype = *weights;
      image_ = make_dense_gguf(q);
      file_ = GGUFFile::parse(image_.data(), image_.size(), p->name);
      dequantise.reset();  // generated in the asked format already
    } else {
      file_ = GGUFFile::open(resolve_model_path(name_or_path));
    }
    model_ = DenseModel::load(*file_, dequantise);
    const DenseConfig& c = model_->config();
    n_vocab_ = c.n_vocab;
    train_ctx_ = c.n_ctx_train;
    if (file_->has("tokenizer.ggml.model")) {
      tokenizer_ = Tokenizer::from_gguf(*file_);
      chat_ = detect_chat_format(*file_);
      chat_declared_ = file_->has("tokenizer.chat_template");
    } else {
      tokenizer_ = byte_tokenizer(n_vocab_, name_);
    }
    // Every token the tokenizer can produce needs an embedding row (and a
    // logit): a shorter table would fail, or read out of bounds, only once
    // such a token comes up in a prompt.
    if (tokenizer_->n_vocab() > n_vocab_)
      fail("{}: tensor 'token_embd.weight' has {} rows, fewer than the {} tokens of the tokenizer", file_->name(),
           n_vocab_, tokenizer_->n_vocab());
    description_ = fmt::format("{}: {} layers, hidden {}, {} heads ({} kv), vocab {}, {} ({:.1f} MB read per step)",
                               c.arch_name, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_vocab,
                               dtype_traits(model_->layers()[0].w_up.type).name, model_->weight_bytes() / 1e6);
  }
  DecodeProgram build_program_for(int max_rows) const override { return build_dense_program(*model_, max_rows); }
  SequenceState new_sequence(int n_ctx) const override {
    SequenceState s;
    s.cache = model_->make_cache(n_ctx);
    return s;
  }
  bool prompt_forward_logits(ThreadPool& pool, SequenceState& seq, const int32_t* tokens, int n, int pos0, int n_out,
                             float* logits) const override {
    model_->forward(pool, seq.cache, tokens, n, pos0, n_out, logits, numerics_);
    return true;
  }
  bool prompt_forward_available() const override { return true; }

 private:
  std::vector<uint8_t> image_;
  std::unique_ptr<GGUFFile> file_;
  std::unique_ptr<DenseModel> model_;
};

// An architecture model (Qwen3.8, Kimi K3, Muse Spark): the model object, its
// program builder, and per-sequence state — a KV cache, plus a
// RecurrentState for models that have one (make_state).
template <class M, DecodeProgram (*Build)(const M&, int)>
class ArchRuntimeModel final : public Model {
 public:
  static constexpr bool kRecurrent = requires(const M& m) { m.make_state(); };

  // `summary` describes the architecture and its sizes; the weights read
  // per step are appended.
  ArchRuntimeModel(const std::string& name, std::unique_ptr<M> m, const std::string& summary)
      : model_(std::move(m)) {
    name_ = name;
    n_vocab_ = model_->config().vocab;
    recurrent_ = kRecurrent;
    tokenizer_ = byte_tokenizer(n_vocab_, name_);
    description_ = fmt::format("{} ({:.1f} MB read per step)", summary, build_program(1).weight_bytes() / 1e6);
  }
  DecodeProgram build_program_for(int max_rows) const override { return Build(*model_, max_rows); }
  SequenceState new_sequence(int n_ctx) const override {
    SequenceState s;
    s.cache = model_->make_cache(n_ctx);
    if constexpr (kRecurrent) {
      s.state = model_->make_state();
      s.recurrent = true;
    }
    return s;
  }

 private:
  std::unique_ptr<M> model_;
};

std::unique_ptr<Model> qwen38_runtime(const std::string& name, std::unique_ptr<Qwen38Model> m) {
  const Qwen38Config& c = m->config();
  const std::string summary =
      fmt::format("qwen3.8 (Gated DeltaNet + gated attention): {} layers, hidden {}, vocab {}, {}", c.n_layer, c.hidden,
                  c.vocab, dtype_traits(m->layers()[0].w_up.type).name);
  return std::make_unique<ArchRuntimeModel<Qwen38Model, build_qwen38_program>>(name, std::move(m), summary);
}

std::unique_ptr<Model> muse_runtime(const std::string& name, std::unique_ptr<MuseModel> m) {
  const MuseConfig& c = m->config();
  const std::string summary = fmt::format(
      "muse-spark (MoE, sliding-window + NoPE attention): {} layers, hidden {}, {} experts top-{}, vocab {}, dense {}, "
      "experts {}",
      c.n_layer, c.hidden, c.n_expert, c.top_k, c.vocab, dtype_traits(m->dense_format()).name,
      dtype_traits(m->expert_format()).name);
  return std::make_unique<ArchRuntimeModel<MuseModel, build_muse_program>>(name, std::move(m), summary);
}

std::unique_ptr<Model> kimi_runtime(const std::string& name, std::unique_ptr<KimiModel> m) {
  const KimiConfig& c = m->config();
  const std::string summary =
      fmt::format("kimi-k3 (KDA + gated MLA, latent MoE): {} layers, hidden {}, {} experts top-{}, vocab {}", c.n_layer,
                  c.hidden, c.n_expert, c.n_expert_used, c.vocab);
  return std::make_unique<ArchRuntimeModel<KimiModel, build_kimi_program>>(name, std::move(m), summary);
}

KimiWeightOptions kimi_options(const ModelOptions& o) {
  KimiWeightOptions k;
  if (o.weights) k.dense = *o.weights;
  if (o.experts) {
    if (*o.experts == DType::FP8_E4M3)
      k.fp8_experts = true;
    else if (*o.experts != DType::MXFP4)
      fail("--experts: Kimi K3 experts are mxfp4, or fp8_e4m3 re-blocked from them; got {}", dtype_traits(*o.experts).name);
  }
  return k;
}

std::string too_big(const std::string& name, double gb) {
  return fmt::format("preset '{}' is the full-size configuration ({:.0f} GB of weights); it can be described "
                     "(megakern inspect --config {}) but not generated here",
                     name, gb, name);
}

}  // namespace

std::vector<std::string> known_model_and_preset_names() {
  std::vector<std::string> v = known_model_names();
  for (const auto& p : dense_presets()) v.push_back(p.name);
  for (const auto& p : qwen38_presets())
    if (p.name != "qwen3.8-27b") v.push_back(p.name);
  for (const auto& p : muse_presets())
    if (p.name != "muse-spark-1.2") v.push_back(p.name);
  for (const auto& p : kimi_presets())
    if (p.name != "kimi-k3") v.push_back(p.name);
  return v;
}

namespace {

std::unique_ptr<Model> load_model_as_given(const std::string& name_or_path, const ModelOptions& opts) {
  namespace fs = std::filesystem;
  if (const Qwen38Config* c = find_qwen38_preset(name_or_path)) {
    if (c->name == "qwen3.8-27b") fail("{}", too_big(c->name, weight_bytes_total(*c, DType::BF16) / 1e9));
    return qwen38_runtime(name_or_path, Qwen38Model::synthetic(*c, opts.seed, opts.weights));
  }
  if (const MuseConfig* c = find_muse_preset(name_or_path)) {
    if (c->name == "muse-spark-1.2") fail("{}", too_big(c->name, 446.5));
    return muse_runtime(
        name_or_path, MuseModel::synthetic(*c, opts.seed, opts.weights.value_or(DType::BF16),
                                           opts.experts.value_or(DType::INT4_G128)));
  }
  if (const KimiConfig* c = find_kimi_preset(name_or_path)) {
    if (c->name == "kimi-k3") fail("{}", too_big(c->name, 1560));
    return kimi_runtime(name_or_path, KimiModel::synthetic(*c, opts.seed, kimi_options(opts)));
  }
  if (opts.experts && opts.experts != DType::FP8_E4M3)
    fail("--experts applies to the synthetic MoE presets (and fp8_e4m3 to Kimi K3 checkpoints) only");
  std::error_code ec;
  if (fs::is_directory(name_or_path, ec)) {
    const HFConfig hf = HFConfig::load(name_or_path);
    const std::string mt = hf.model_type();
    if (mt == "qwen3_5_text" || mt == "qwen3_5")
      return qwen38_runtime(name_or_path, Qwen38Model::load(name_or_path, opts.weights));
    if (mt == "kimi_k3") {
      if (opts.weights) fail("{}: a Kimi K3 checkpoint keeps the dense format it was written in (drop --weights)", name_or_path);
      return kimi_runtime(name_or_path, KimiModel::load(name_or_path, kimi_options(opts)));
    }
    if (mt == "muse_spark") {
      if (opts.weights) fail("{}: a Muse Spark checkpoint keeps the formats it was written in (drop --weights)", name_or_path);
      return muse_runtime(name_or_path, MuseModel::load(name_or_path));
    }
    fail("{}: model_type '{}' is not an architecture this engine runs from a checkpoint directory "
         "(supported: qwen3_5_text, kimi_k3, muse_spark)",
         name_or_path, mt);
  }
  if (opts.weights && find_dense_preset(name_or_path))
    return std::make_unique<DenseRuntimeModel>(name_or_path, opts.weights);
  if (opts.weights && *opts.weights != DType::F32)
    fail("model '{}': a GGUF file keeps its weight formats; --weights can only be f32 for it "
         "(every matrix dequantised at load), got {}",
         name_or_path, dtype_traits(*opts.weights).name);
  return std::make_unique<DenseRuntimeModel>(name_or_path, opts.weights);
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& name_or_path, const ModelOptions& opts) {
  std::unique_ptr<Model> m = load_model_as_given(name_or_path, opts);
  m->set_numerics(opts.numerics);
  return m;
}

}  // namespace megakern
