#include "runtime/session.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"

namespace megakern {

Session::Session(const Model& model, ThreadPool& pool, int n_ctx, const std::string& executor, int max_rows)
    : engine_(model, pool, max_rows > 0 ? max_rows : 8, executor),
      seq_(model.new_sequence(n_ctx)) {
  if (max_rows > 0) engine_.set_prefill_rows(max_rows);  // an explicit block (--ubatch) is the prefill block
}

const std::vector<float>& Session::set_tokens(const std::vector<int32_t>& tokens) {
  if (tokens.empty()) fail("the prompt is empty: there is nothing to run");
  if (static_cast<int64_t>(tokens.size()) > seq_.n_ctx())
    fail("the prompt has {} tokens, more than the context of {} (raise --context)", tokens.size(), seq_.n_ctx());
  const size_t common = reusable_prefix(tokens);
  if (common == 0) seq_.clear();
  const int n = static_cast<int>(tokens.size() - common);
  // Until the pass succeeds, only the shared prefix is valid (for recurrent
  // models not even that: their state may be half advanced).
  tokens_.resize(seq_.recurrent ? 0 : common);
  logits_.resize(static_cast<size_t>(engine_.n_vocab()));
  engine_.prefill(seq_, tokens.data() + common, n, static_cast<int>(common), logits_.data());
  tokens_ = tokens;
  return logits_;
}

size_t Session::reusable_prefix(const std::vector<int32_t>& tokens) const {
  size_t common = 0;
  while (common < tokens_.size() && common < tokens.size() && tokens_[common] == tokens[common]) ++common;
  if (seq_.recurrent && common < tokens_.size()) return 0;
  if (!tokens.empty() && common == tokens.size()) {
    if (seq_.recurrent) return 0;
    --common;
  }
  return common;
}

const std::vector<float>& Session::append(int32_t token) {
  if (static_cast<int64_t>(tokens_.size()) >= seq_.n_ctx())
    fail("context full: all {} positions are used (raise --context)", seq_.n_ctx());
  logits_.resize(static_cast<size_t>(engine_.n_vocab()));
  engine_.step({seq_.row(token, static_cast<int32_t>(tokens_.size()))}, logits_.data());
  tokens_.push_back(token);
  return logits_;
}

const std::vector<std::string>& known_model_names() {
  static const std::vector<std::string> names = {"smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"};
  return names;
}

std::string resolve_model_path(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(name_or_path, ec)) return name_or_path;
  const bool known =
      std::find(known_model_names().begin(), known_model_names().end(), name_or_path) != known_model_names().end();
  if (!known) {
    if (fs::exists(name_or_path, ec)) fail("model '{}' is not a regular file", name_or_path);
    fail("model '{}' not found: it is neither a file nor a known model name (known: {})", name_or_path,
         fmt::join(known_model_and_preset_names(), ", "));
  }
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("MEGAKERN_MODELS_DIR")) dirs.emplace_back(env);
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    dirs.push_back(exe.parent_path() / "models");
    dirs.push_back(exe.parent_path().parent_path() / "models");
  }
  dirs.emplace_back("models");
  for (const auto& d : dirs) {
    const fs::path p = d / (name_or_path + ".gguf");
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  fail("model '{}' has not been fetched: run scripts/setup.sh to download it (looked in {})", name_or_path,
       [&] {
         std::string s;
         for (const auto& d : dirs) s += (s.empty() ? "" : ", ") + d.string();
         return s;
       }());
}

}  // namespace megakern
