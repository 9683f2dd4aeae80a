#include "io/model_format.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace megakern {

SniffedFormat sniff_model_format(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '{}'", path);
  unsigned char head[9] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  const auto got = static_cast<size_t>(in.gcount());
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  SniffedFormat s;
  if (got >= 4 && std::memcmp(head, "GGUF", 4) == 0) {
    s.format = ModelFileFormat::GGUF;
    s.detail = "GGUF magic";
    return s;
  }
  // safetensors: a little-endian u64 header length, then the JSON header,
  // which begins with '{' and must fit in the file.
  if (got >= 9 && !ec) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
    if (head[8] == '{' && n >= 2 && n <= size - 8) {
      s.format = ModelFileFormat::Safetensors;
      s.detail = fmt::format("a safetensors header of {} bytes", n);
      return s;
    }
  }
  std::string hex;
  for (size_t i = 0; i < got; ++i) hex += fmt::format("{:02x}", head[i]);
  s.detail = got == 0 ? std::string("an empty file")
                      : fmt::format("first bytes {} (\"{}\"): neither the GGUF magic \"GGUF\" nor a safetensors "
                                    "header (a u64 length, then '{{')",
                                    hex, printable(std::string_view(reinterpret_cast<const char*>(head), got)));
  return s;
}

}  // namespace megakern
