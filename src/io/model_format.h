// Which model file format a file holds, judged by its first bytes rather than
// its name, so that a file in neither format is reported as such instead of
// failing with the other parser's complaints.
#pragma once

#include <string>

namespace megakern {

enum class ModelFileFormat { GGUF, Safetensors, Unknown };

struct SniffedFormat {
  ModelFileFormat format = ModelFileFormat::Unknown;
  // What was found, for messages: "GGUF magic", "a safetensors header of N
  // bytes", or what the first bytes are when neither fits.
  std::string detail;
};

// Reads the first bytes of `path`. Throws megakern::Error when the file
// cannot be opened.
SniffedFormat sniff_model_format(const std::string& path);

}  // namespace megakern
