#include "runtime/model.h"

#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "io/gguf.h"
#include "io/mmap_file.h"
#include "io/hf_config.h"
#include "model/dense_families.h"
#include "runtime/session.h"
#include "tokenizer/hf_tokenizer.h"

namespace megakern {


DecodeProgram Model::build_program(int max_rows) const {
  DecodeProgram p = transformed(build_program_for(max_rows));
  p.numerics = numerics_;
  for (Op& op : p.ops) {
    if (op.kind != OpKind::MatMul || !repack_ || (numerics_ == Numerics::Exact && !repack_exact_)) continue;
    op.mat = packed_->pack(op.mat, numerics_);
    // One copy in memory: the packed rows' original pages leave (they come
    // back from the file only if something reads them: an embedding row,
    // the tail rows, a path without packed kernels).
    if (op.mat.packed != nullptr)
      release_mapped_pages(op.mat.data, (size_t)(op.mat.rows / kR16Rows * kR16Rows) * op.mat.row_bytes);
  }
  return p;
}

size_t Model::packed_weight_bytes() const { return packed_->bytes(); }

namespace {

// A checkpoint directory's tokenizer.json or tiktoken.model, if it has one; a
// directory with other tokenizer files but neither is refused rather than
// given the byte tokenizer.
std::optional<std::string> hf_tokenizer_dir(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return std::nullopt;
  if (has_hf_tokenizer(path)) return path;
  for (const char* other : {"tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt"})
    if (fs::exists(fs::path(path) / other, ec))
      fail("{}: the directory has {} but no tokenizer.json or tiktoken.model; only those tokenizers are supported",
           path, other);
  return std::nullopt;
}

}  // namespace

Model::Model(const std::string& name, std::unique_ptr<ArchModel> arch) : arch_(std::move(arch)) {
  name_ = name;
  n_vocab_ = arch_->n_vocab();
  train_ctx_ = arch_->train_context();
  max_program_rows_ = arch_->max_program_rows();
  set_sequence_shape(arch_->ring_block());
  const GGUFFile* file = arch_->gguf();
  if (file && file->has("tokenizer.ggml.model")) {
    tokenizer_ = Tokenizer::from_gguf(*file);
    chat_ = detect_chat_format(*file);
    bind_chat_tokens(chat_, *tokenizer_);
    chat_declared_ = file->has("tokenizer.chat_template");
  } else if (std::optional<std::string> dir = hf_tokenizer_dir(name_)) {
    std::optional<std::string> tmpl;
    tokenizer_ = load_hf_tokenizer(*dir, &tmpl);
    if (tmpl) chat_ = chat_format_from_template(*tmpl);
    chat_declared_ = tmpl.has_value();
    if (chat_.kind == ChatTemplate::None && tokenizer_->find_token("<|im_start|>")) chat_.kind = ChatTemplate::ChatML;
    // Without a template, a vocabulary with Kimi K3's message markers gets
    // its format (as the published server renders it).
    if (chat_.kind == ChatTemplate::None && !tmpl) {
      bool kimi = true;
      for (const char* t : {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"}) {
        const std::optional<int32_t> id = tokenizer_->find_token(t);
        kimi = kimi && id && tokenizer_->is_special(*id);
      }
      if (kimi) chat_ = *builtin_chat_format("kimi-k3");
    }
  } else if (n_vocab_ >= 256) {
    tokenizer_ = std::make_unique<Tokenizer>(byte_vocab(n_vocab_));
  } else {
    // Token ids still run (teacher forcing, benchmarks of programs); text
    // cannot.
    no_tokenizer_ = fmt::format(
        "model '{}' has no tokenizer of its own and a vocabulary of {} tokens, too small for the byte tokenizer "
        "(256 needed)",
        name_, n_vocab_);
  }
  // Every token the tokenizer can produce needs an embedding row (and a
  // logit): a shorter table would fail, or read out of bounds, only once
  // such a token comes up in a prompt.
  if (tokenizer_ && tokenizer_->n_vocab() > n_vocab_)
    fail("{}: tensor 'token_embd.weight' has {} rows, fewer than the {} tokens of the tokenizer",
         file ? file->name() : name_, n_vocab_, tokenizer_->n_vocab());
  description_ = arch_->description();
}

Model::~Model() = default;

const Tokenizer& Model::tokenizer() const {
  if (!tokenizer_) fail("{}", no_tokenizer_);
  return *tokenizer_;
}

void Model::set_chat_format(ChatFormat f) {
  bind_chat_tokens(f, tokenizer());
  chat_ = std::move(f);
  chat_declared_ = true;
}

namespace {

std::unique_ptr<ArchModel> load_arch_gguf(std::unique_ptr<GGUFFile> file, const ModelOptions& opts) {
  if (opts.weights && *opts.weights != DType::F32)
    fail("model '{}': a GGUF file keeps its weight formats; --weights can only be f32 for it "
         "(every matrix dequantised at load), got {}",
         file->name(), dtype_traits(*opts.weights).name);
  const std::string arch = file->get_string("general.architecture");
  if (const Architecture* a = architecture_of_gguf(arch)) return a->load_gguf(std::move(file), opts);
  if (auto why = unsupported_gguf_reason(arch))
    fail("{}: architecture '{}' is not supported: {}", file->name(), arch, *why);
  std::vector<std::string> known;
  for (const Architecture* a : architectures())
    for (const std::string& g : a->gguf_architectures()) known.push_back(g);
  fail("{}: architecture '{}' is not supported (expected one of {})", file->name(), arch, join_names(known));
}

std::unique_ptr<ArchModel> load_arch_model(const std::string& name_or_path, const ModelOptions& opts) {
  namespace fs = std::filesystem;
  if (const Architecture* a = architecture_of_preset(name_or_path)) return a->synthetic(name_or_path, opts);
  if (opts.experts && opts.experts != DType::FP8_E4M3)
    fail("--experts applies to the synthetic MoE presets (and fp8_e4m3 to Kimi K3 checkpoints) only");
  std::error_code ec;
  if (fs::is_directory(name_or_path, ec)) {
    const std::string mt = HFConfig::load(name_or_path).model_type();
    if (const Architecture* a = architecture_of_hf(mt)) return a->load_dir(name_or_path, opts);
    std::vector<std::string> known;
    for (const Architecture* a : architectures())
      if (!a->hf_model_types().empty()) known.push_back(a->hf_model_types().front());
    fail("{}: model_type '{}' is not an architecture this engine runs from a checkpoint directory (supported: {})",
         name_or_path, mt, join_names(known));
  }
  return load_arch_gguf(GGUFFile::open(resolve_model_path(name_or_path)), opts);
}

}  // namespace

std::vector<std::string> known_model_and_preset_names() {
  std::vector<std::string> v = known_model_names();
  for (const std::string& p : all_presets(/*runnable_only=*/true)) v.push_back(p);
  return v;
}

std::unique_ptr<Model> load_model(const std::string& name_or_path, const ModelOptions& opts) {
  auto m = std::make_unique<Model>(name_or_path, load_arch_model(name_or_path, opts));
  m->set_numerics(opts.numerics);
  m->set_kv_type(opts.kv_type);
  return m;
}

std::unique_ptr<Model> load_model(std::unique_ptr<GGUFFile> file, const ModelOptions& opts) {
  if (!file) fail("load_model: no GGUF file");
  const std::string name = file->name();
  auto m = std::make_unique<Model>(name, load_arch_gguf(std::move(file), opts));
  m->set_numerics(opts.numerics);
  m->set_kv_type(opts.kv_type);
  return m;
}

}  // namespace megakern
