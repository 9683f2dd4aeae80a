// Helpers shared by the tests: where fixtures and fetched models live.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace megakern {

inline std::string fixture_path(const std::string& name) {
  return std::string(MEGAKERN_SOURCE_DIR) + "/tests/fixtures/" + name;
}

// Path of a fetched model ("smollm2-135m"), or "" when it is absent. Tests
// that need a real model skip with a message naming it when it is missing;
// CI fetches the models first, so there they always run.
inline std::string test_model_path(const std::string& name) {
  std::string dir;
  if (const char* env = std::getenv("MEGAKERN_MODELS_DIR"))
    dir = env;
  else
    dir = std::string(MEGAKERN_SOURCE_DIR) + "/models";
  const std::string p = dir + "/" + name + ".gguf";
  return std::filesystem::is_regular_file(p) ? p : "";
}

}  // namespace megakern
