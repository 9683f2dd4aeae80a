#include "model/architecture.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "io/gguf.h"

namespace megakern {

// The registry: one line per architecture (each defined in its own files).
const Architecture& dense_architecture();   // model/dense.cpp
const Architecture& qwen38_architecture();  // model/qwen38.cpp
const Architecture& muse_architecture();    // model/muse.cpp
const Architecture& kimi_architecture();    // model/kimi.cpp

const std::vector<const Architecture*>& architectures() {
  static const std::vector<const Architecture*> all = {
      &dense_architecture(),
      &qwen38_architecture(),
      &muse_architecture(),
      &kimi_architecture(),
  };
  return all;
}

ArchModel::~ArchModel() = default;
Architecture::~Architecture() = default;

bool Architecture::has_preset(const std::string& preset) const {
  const auto p = presets();
  return std::find(p.begin(), p.end(), preset) != p.end();
}

std::unique_ptr<ArchModel> Architecture::load_dir(const std::string& dir, const ModelOptions&) const {
  fail("{}: the {} architecture is not read from a checkpoint directory", dir, name());
}

std::unique_ptr<ArchModel> Architecture::load_gguf(std::unique_ptr<GGUFFile> file, const ModelOptions&) const {
  fail("{}: the {} architecture is not read from GGUF", file->name(), name());
}

void Architecture::generate(const std::string& preset, const GenOptions&, const std::string&) const {
  fail("--config {}: the {} presets are generated in memory only (load them by name)", preset, name());
}

std::unique_ptr<ArchModel> Architecture::shapes_only(const std::string&) const { return nullptr; }

namespace {

template <class Pred>
const Architecture* find_arch(Pred pred) {
  for (const Architecture* a : architectures())
    if (pred(*a)) return a;
  return nullptr;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

const Architecture* architecture_of_preset(const std::string& preset) {
  return find_arch([&](const Architecture& a) { return a.has_preset(preset); });
}

const Architecture* architecture_of_hf(const std::string& model_type) {
  return find_arch([&](const Architecture& a) { return contains(a.hf_model_types(), model_type); });
}

const Architecture* architecture_of_gguf(const std::string& general_architecture) {
  return find_arch([&](const Architecture& a) { return contains(a.gguf_architectures(), general_architecture); });
}

std::vector<std::string> all_presets(bool runnable_only) {
  std::vector<std::string> v;
  for (const Architecture* a : architectures())
    for (const std::string& p : a->presets())
      if (!runnable_only || a->runnable(p)) v.push_back(p);
  return v;
}

std::string join_names(const std::vector<std::string>& names) { return fmt::format("{}", fmt::join(names, ", ")); }

void fail_full_size(const std::string& preset, double gb) {
  fail("preset '{}' is the full-size configuration ({:.0f} GB of weights); it can be described "
       "(megakern inspect --config {}) but not generated here",
       preset, gb, preset);
}

}  // namespace megakern
