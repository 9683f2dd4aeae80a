// safetensors reader (memory-mapped, zero-copy tensor views), for a single
// file or a sharded Hugging Face checkpoint directory.
//
// Layout of a safetensors file:
//   bytes [0, 8)        N, the header length, little-endian u64;
//   bytes [8, 8 + N)    a JSON object: for every tensor
//                         "name": {"dtype": "F16", "shape": [d0, d1, ...],
//                                  "data_offsets": [begin, end]}
//                       plus an optional "__metadata__": {string: string};
//   bytes [8 + N, EOF)  the data buffer. Offsets are relative to its start.
// Shapes are row-major in PyTorch order: shape[0] is the outermost (slowest
// varying) dimension and the last entry is contiguous. That is the reverse of
// GGUF, where shape[0] is the contiguous dimension.
//
// The reader validates the whole header before handing out any pointer: the
// header length against the file size, JSON syntax (including UTF-8 and
// duplicate keys, which JSON libraries usually drop silently), the fields of
// every entry and their types, the dtype, shapes (non-negative, no overflow),
// offsets (two non-decreasing integers whose extent matches shape and dtype),
// and the data buffer as a whole: tensors may neither overlap nor leave holes,
// and the buffer must end where the last tensor ends, as the format requires.
// Every violation throws megakern::Error naming the file and what was wrong, so
// the reader never reads out of bounds and is safe on untrusted input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <optional>
#include <vector>

#include "core/dtype.h"

namespace megakern {

class MappedFile;

// The float format of a safetensors dtype ("F32", "F16", "BF16"), or nullopt.
std::optional<DType> safetensors_float_format(const std::string& dtype);

// A view of one tensor. `data` points into the buffer the file was parsed from
// (the mapping for SafetensorsFile::open) and is valid as long as the file
// object lives. The data is not necessarily aligned: read it with memcpy.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // as spelled in the file: "F32", "BF16", "F8_E4M3", ...
  size_t elem_bytes = 0;       // bytes per element for dtype
  std::vector<int64_t> shape;  // row-major, shape[0] outermost; empty for a scalar
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;  // == numel() * elem_bytes

  // Number of elements: the product of shape (1 for a scalar). The reader has
  // checked that it does not overflow.
  int64_t numel() const;
};

// Bytes per element of a safetensors dtype name ("F16" -> 2), or 0 when the
// name is not one this reader knows. Names are case-sensitive, as in the format.
size_t safetensors_dtype_bytes(const std::string& dtype);

class SafetensorsFile {
 public:
  // Maps and validates path; throws megakern::Error on any problem.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Parses a buffer the caller keeps alive for the life of the result (used by
  // tests and fuzzing). `name` is used in error messages.
  static std::unique_ptr<SafetensorsFile> parse(const uint8_t* data, size_t size, const std::string& name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& name() const { return name_; }
  // Tensors in file order, that is by position in the data buffer (tensors of
  // zero bytes, which share an offset with a neighbour, keep header order).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The tensor called name, or nullptr.
  const SafetensorsTensor* find(const std::string& name) const;
  // The tensor called name; throws megakern::Error naming it and the file when missing.
  const SafetensorsTensor& tensor(const std::string& name) const;
  // The "__metadata__" map (empty when the header has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Frees the tensor table (names, shapes, the index), keeping the mapping:
  // for a holder of views into the data that needs no more look-ups.
  void release_table();
  // Header length N and the size of the data buffer, for diagnostics.
  uint64_t header_bytes() const { return header_bytes_; }
  uint64_t data_bytes() const { return data_bytes_; }

 private:
  SafetensorsFile() = default;
  void parse_all(const uint8_t* data, size_t size);

  std::string name_;
  std::unique_ptr<MappedFile> map_;
  uint64_t header_bytes_ = 0;
  uint64_t data_bytes_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// A checkpoint made of one or more safetensors files, looked up by tensor name.
class SafetensorsModel {
 public:
  // Accepts:
  //  - a .safetensors file;
  //  - a "*.safetensors.index.json" file: its "weight_map" ({tensor: shard})
  //    names the shards, resolved relative to the index's directory;
  //  - a directory holding model.safetensors (preferred when present, as the
  //    Hugging Face loaders do) or model.safetensors.index.json.
  // With an index, every listed shard must exist and hold every tensor the
  // index assigns to it; the index is authoritative, so a tensor a shard holds
  // but the index does not list is not visible. Throws megakern::Error.
  static SafetensorsModel open(const std::string& path_or_dir);
  // A model of one already parsed file (e.g. SafetensorsFile::parse over a
  // buffer the caller keeps alive); `path` is used in messages.
  static SafetensorsModel from_file(std::unique_ptr<SafetensorsFile> file, const std::string& path);

  SafetensorsModel(SafetensorsModel&&) noexcept;
  SafetensorsModel& operator=(SafetensorsModel&&) noexcept;
  ~SafetensorsModel();

  // The path given to open().
  const std::string& path() const { return path_; }
  // The loaded files: one, or the shards in the order the index first names them.
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // Every visible tensor, shard by shard, each shard in file order.
  const std::vector<const SafetensorsTensor*>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  const SafetensorsTensor* find(const std::string& name) const;
  // Throws megakern::Error naming the tensor and the model when missing.
  const SafetensorsTensor& tensor(const std::string& name) const;
  // The file holding a tensor (for error messages); throws when missing.
  const SafetensorsFile& file_of(const std::string& name) const;
  // The index's "metadata" object flattened to strings (e.g. "total_size"),
  // or for a single file its "__metadata__".
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Frees every file's tensor table and the model's index, keeping the files
  // mapped (views of their data stay valid); no tensor is found afterwards.
  void release_tables();

 private:
  SafetensorsModel() = default;
  void add_file(std::unique_ptr<SafetensorsFile> file);

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<const SafetensorsTensor*> tensors_;
  // name -> (tensor, index into files_)
  std::map<std::string, std::pair<const SafetensorsTensor*, size_t>> index_;
  std::map<std::string, std::string> metadata_;
};

// Converts a tensor to f32, element by element in storage order. Supports the
// float types (F64, F32, F16, BF16, F8_E4M3, F8_E5M2, F8_E8M0), the integer
// types (I8..I64, U8..U64; wide values round to the nearest float) and BOOL
// (0 or 1). Throws megakern::Error naming the tensor for anything else, or when
// n_bytes does not match shape and dtype (possible for hand-built views).
std::vector<float> to_f32(const SafetensorsTensor& t);

// Scalar decoders for the 8-bit float formats, exposed for tests and kernels.
// E4M3 is the "fn" variant used by PyTorch and OCP: no infinities, and
// S.1111.111 is NaN. E5M2 follows IEEE rules (infinities and NaNs). E8M0 is an
// unsigned power-of-two scale, 2^(e - 127), with 0xFF meaning NaN.
float f8_e4m3_to_f32(uint8_t v);
float f8_e5m2_to_f32(uint8_t v);
float f8_e8m0_to_f32(uint8_t v);

}  // namespace megakern
