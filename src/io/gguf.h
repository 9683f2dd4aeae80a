// GGUF v3 reader (memory-mapped, zero-copy tensor views) and writer.
//
// The reader validates every field before use: magic and version, every length
// and count against the bytes that remain, value types, tensor types, shapes,
// offsets, alignment and the extent of each tensor's data. Any violation throws
// megakern::Error with the file name and what was wrong; it never reads out of
// bounds, so it is safe on untrusted input (see fuzz/fuzz_gguf.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/dtype.h"

namespace megakern {

class MappedFile;

enum class GGUFValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

// One metadata value. Arrays hold scalars or strings (nested arrays are
// accepted by the format but unused by models; they are rejected).
struct GGUFValue {
  using Scalar = std::variant<uint64_t, int64_t, double, bool, std::string>;
  GGUFValueType type = GGUFValueType::UINT32;
  GGUFValueType elem_type = GGUFValueType::UINT32;  // for arrays
  Scalar scalar;                                    // for non-arrays
  // For arrays: exactly one of these is filled, by element type.
  std::vector<std::string> strings;
  std::vector<int64_t> ints;      // all integer and bool element types
  std::vector<double> floats;     // float32 / float64 elements
  uint64_t array_len = 0;
};

struct GGUFTensorInfo {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;  // GGUF order: shape[0] is the contiguous (row) dimension
  uint64_t offset = 0;         // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // points into the mapping
};

class GGUFFile {
 public:
  // Opens and validates path; throws megakern::Error on any problem.
  static std::unique_ptr<GGUFFile> open(const std::string& path);
  // Parses a buffer that the caller keeps alive (used by tests and the fuzzer).
  static std::unique_ptr<GGUFFile> parse(const uint8_t* data, size_t size, const std::string& name);
  ~GGUFFile();

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& name() const { return name_; }

  const std::map<std::string, GGUFValue>& metadata() const { return kv_; }
  const std::vector<std::string>& metadata_order() const { return kv_order_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GGUFValue* find(const std::string& key) const;

  // Typed getters. The required forms throw if the key is missing or of the
  // wrong type; the optional forms return nullopt when missing (and still throw
  // on a wrong type).
  std::string get_string(const std::string& key) const;
  std::optional<std::string> get_string_opt(const std::string& key) const;
  int64_t get_int(const std::string& key) const;  // any integer type
  std::optional<int64_t> get_int_opt(const std::string& key) const;
  double get_float(const std::string& key) const;  // float or integer type
  std::optional<double> get_float_opt(const std::string& key) const;
  std::optional<bool> get_bool_opt(const std::string& key) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  const std::vector<int64_t>& get_int_array(const std::string& key) const;
  const std::vector<double>& get_float_array(const std::string& key) const;

  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo* find_tensor(const std::string& name) const;
  const GGUFTensorInfo& tensor(const std::string& name) const;  // throws if missing

 private:
  GGUFFile() = default;
  void parse_all(const uint8_t* data, size_t size);

  std::string name_;
  std::unique_ptr<MappedFile> map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GGUFValue> kv_;
  std::vector<std::string> kv_order_;
  std::vector<GGUFTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Builds a GGUF v3 file in memory and writes it out.
class GGUFWriter {
 public:
  explicit GGUFWriter(uint64_t alignment = 32) : alignment_(alignment) {}
  void set_string(const std::string& key, const std::string& v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  // Adds a tensor whose data is already in `type` (bytes must equal row_bytes * rows).
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape,
                  const void* data, size_t bytes);
  // Adds an f32 tensor quantised to `type` with the reference quantiser.
  void add_tensor_f32(const std::string& name, DType type, const std::vector<int64_t>& shape,
                      const float* data);
  std::vector<uint8_t> serialize() const;
  void write(const std::string& path) const;  // throws on I/O failure

 private:
  struct KV {
    std::string key;
    std::vector<uint8_t> bytes;  // type tag + value, serialised
  };
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  void put_kv(const std::string& key, std::vector<uint8_t> bytes);
  uint64_t alignment_;
  std::vector<KV> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace megakern
