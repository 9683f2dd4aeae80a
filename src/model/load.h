// Loading a dense model by path, fetched-model name or bench preset name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "model/dense.h"

namespace megakern {

struct LoadedDense {
  std::vector<uint8_t> image;  // the GGUF bytes of a generated preset (empty for files)
  std::unique_ptr<GGUFFile> file;
  std::unique_ptr<DenseModel> model;
  std::string name;
};

// A bench preset ("dense-bench") is generated in memory; anything else is
// resolved as a path or fetched model name. Throws megakern::Error.
LoadedDense load_dense(const std::string& name_or_path);

}  // namespace megakern
