// libFuzzer target for the server's request parsing: any bytes as a request
// body must become a validated generation request or an ApiError (an HTTP
// 4xx with a message), for /v1/completions and /v1/chat/completions alike.
// Any other exception (a JSON type error slipping through, say) is a bug:
// the server would answer it without naming the field.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "core/error.h"
#include "runtime/model.h"
#include "server/api.h"

namespace {

struct Models {
  std::vector<std::unique_ptr<megakern::Model>> models;
};

Models& models() {
  static Models m = [] {
    Models out;
    out.models.push_back(megakern::load_model("dense-mini"));
    const char* env = std::getenv("MEGAKERN_MODELS_DIR");
    const std::string path = std::string(env ? env : "models") + "/smollm2-135m.gguf";
    if (std::filesystem::is_regular_file(path)) out.models.push_back(megakern::load_model(path));
    return out;
  }();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto& ms = models().models;
  const megakern::Model& model = *ms[data[0] % ms.size()];
  megakern::server::ApiLimits limits;
  limits.model_names = {"m", model.name()};
  limits.n_ctx = 256;
  limits.max_tokens = 16;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const auto j = megakern::server::parse_json_object(body);
    try {
      const auto rs = megakern::server::parse_completion_requests(j, model, limits);
      if (rs.empty() || rs.size() > static_cast<size_t>(megakern::server::kMaxPrompts)) __builtin_trap();
      for (size_t i = 0; i < rs.size(); ++i) {
        const auto& r = rs[i];
        if (r.prompt.empty() || static_cast<int>(r.prompt.size()) > limits.n_ctx || r.max_tokens < (r.echo ? 0 : 1) ||
            r.max_tokens > limits.max_tokens || r.index != static_cast<int>(i) ||
            r.logprobs > megakern::server::kMaxLogprobs)
          __builtin_trap();
      }
    } catch (const megakern::server::ApiError& e) {
      if (e.status < 400 || e.status > 499) __builtin_trap();
    }
    const auto r = megakern::server::parse_chat_request(j, model, limits);
    if (r.prompt.empty() || static_cast<int>(r.prompt.size()) > limits.n_ctx) __builtin_trap();
  } catch (const megakern::server::ApiError& e) {
    if (e.status < 400 || e.status > 499) __builtin_trap();
  }
  return 0;
}
