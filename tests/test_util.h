// Helpers shared by the tests: where fixtures and fetched models live, and
// running the megakern binary.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megakern {

// The message of the megakern::Error that f throws, or "" when it throws none.
inline std::string thrown_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

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

// A committed JSON fixture (path under tests/fixtures/), parsed once and
// kept for the rest of the run. Throws naming the file when it is missing.
inline const nlohmann::json& fixture_json(const std::string& name) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    std::ifstream in(fixture_path(name));
    if (!in.good()) throw std::runtime_error("missing fixture " + fixture_path(name));
    it = cache.emplace(name, nlohmann::json::parse(in)).first;
  }
  return it->second;
}

// The numbers of a nested JSON array, in order (reference fixtures).
inline std::vector<float> flatten(const nlohmann::json& j) {
  std::vector<float> out;
  std::function<void(const nlohmann::json&)> rec = [&](const nlohmann::json& e) {
    if (e.is_array())
      for (const auto& x : e) rec(x);
    else
      out.push_back(e.get<float>());
  };
  rec(j);
  return out;
}

// max |a - b| / max |b|: agreement with a reference b.
inline double rel_diff(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(b[i])));
  }
  return num / std::max(den, 1e-30);
}

// A fresh directory under /tmp, removed with everything in it at scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/megakern-test-XXXXXX";
    const char* p = mkdtemp(tmpl);
    path = p ? p : "";
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

// Result of running the megakern binary with stdout and stderr kept apart.
struct CliResult {
  int status = -1;
  std::string out, err;
};

// A shell command's exit status (-1 if it did not exit normally or could not
// start) and its standard output (add 2>&1 to the command for stderr too).
struct ShellResult {
  int status = -1;
  std::string out;
};

inline ShellResult run_shell(const std::string& cmd) {
  ShellResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline CliResult run_cli(const std::string& args) {
  char tmpl[] = "/tmp/megakern-test-err-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  ShellResult sh = run_shell(std::string(MEGAKERN_BINARY) + " " + args + " 2>" + tmpl);
  CliResult r;
  r.status = sh.status;
  r.out = std::move(sh.out);
  std::ifstream f(tmpl);
  r.err.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  std::filesystem::remove(tmpl);
  return r;
}

}  // namespace megakern
