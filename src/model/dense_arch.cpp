// The dense transformers (model/dense_families.h) as an Architecture: GGUF
// files, and the bench presets generated in memory as GGUF images.
#include <fmt/format.h>

#include "core/error.h"
#include "io/gguf.h"
#include "model/architecture.h"
#include "model/dense.h"
#include "model/dense_hf.h"
#include "model/dense_program.h"
#include "model/presets.h"

namespace megakern {
namespace {

class DenseArchModel final : public ArchModel {
 public:
  // `image`: the GGUF bytes the file was parsed from (presets), or empty.
  DenseArchModel(std::vector<uint8_t> image, std::unique_ptr<GGUFFile> file, std::optional<DType> dequantise)
      : image_(std::move(image)), file_(std::move(file)), model_(DenseModel::load(*file_, dequantise)) {}
  DecodeProgram build_program(int max_rows) const override { return build_dense_program(*model_, max_rows); }
  int max_program_rows() const override { return kDenseMaxRows; }
  int n_vocab() const override { return model_->config().n_vocab; }
  int train_context() const override { return model_->config().n_ctx_train; }
  std::string description() const override {
    const DenseConfig& c = model_->config();
    return fmt::format("{}: {} layers, hidden {}, {} heads ({} kv), vocab {}, {} ({:.1f} MB read per step)",
                       c.arch_name, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_vocab,
                       dtype_traits(model_->layers()[0].w_up.type).name, model_->weight_bytes() / 1e6);
  }
  const GGUFFile* gguf() const override { return file_.get(); }

 private:
  std::vector<uint8_t> image_;
  std::unique_ptr<GGUFFile> file_;
  std::unique_ptr<DenseModel> model_;
};

class DenseArchitecture final : public Architecture {
 public:
  std::string name() const override { return "dense"; }
  std::vector<std::string> presets() const override {
    std::vector<std::string> v;
    for (const auto& p : dense_presets()) v.push_back(p.name);
    return v;
  }
  std::vector<std::string> gguf_architectures() const override {
    std::vector<std::string> v;
    for (const DenseFamily& f : dense_families()) v.emplace_back(f.gguf_arch);
    return v;
  }
  std::vector<std::string> hf_model_types() const override {
    std::vector<std::string> v;
    for (const DenseFamily& f : dense_families())
      for (std::string_view t : f.hf_types) v.emplace_back(t);
    return v;
  }
  // A checkpoint directory: converted to the GGUF form in memory (the model
  // keeps the image); `weights` quantises its matrices on the way.
  std::unique_ptr<ArchModel> load_dir(const std::string& dir, const ModelOptions& o) const override {
    if (o.experts) fail("--experts applies to the MoE architectures only");
    std::vector<uint8_t> image = dense_gguf_from_hf(dir, o.weights);
    auto file = GGUFFile::parse(image.data(), image.size(), dir);
    return std::make_unique<DenseArchModel>(std::move(image), std::move(file), std::nullopt);
  }
  // `weights`: the matrix format the preset is generated in.
  std::unique_ptr<ArchModel> synthetic(const std::string& preset, const ModelOptions& o) const override {
    if (o.experts) fail("--experts applies to the synthetic MoE presets (and fp8_e4m3 to Kimi K3 checkpoints) only");
    DensePreset q = *find_dense_preset(preset);
    if (o.weights) q.wtype = *o.weights;
    std::vector<uint8_t> image = make_dense_gguf(q);
    auto file = GGUFFile::parse(image.data(), image.size(), q.name);
    return std::make_unique<DenseArchModel>(std::move(image), std::move(file), std::nullopt);
  }
  // A GGUF file keeps its formats; `weights` can only be F32 (every matrix
  // dequantised at load: the f32 computation of the same weights).
  std::unique_ptr<ArchModel> load_gguf(std::unique_ptr<GGUFFile> file, const ModelOptions& o) const override {
    return std::make_unique<DenseArchModel>(std::vector<uint8_t>{}, std::move(file), o.weights);
  }
  std::string describe(const std::string& preset) const override {
    const DensePreset& p = *find_dense_preset(preset);
    return fmt::format("{} ({} bench preset): {} layers, hidden {}, MLP {}, {} heads ({} kv) of {}, vocab {}, {}\n",
                       p.name, p.arch, p.n_layer, p.n_embd, p.n_ff, p.n_head, p.n_head_kv, p.head_dim, p.n_vocab,
                       dtype_traits(p.wtype).name);
  }
};

}  // namespace

const Architecture& dense_architecture() {
  static const DenseArchitecture a;
  return a;
}

}  // namespace megakern
