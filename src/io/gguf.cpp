#include "io/gguf.h"

#include <algorithm>

#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "io/mmap_file.h"

namespace megakern {
namespace {

constexpr uint32_t kMaxDims = 4;
// Bounds that no real model approaches; they keep a hostile header from making
// us allocate unbounded memory before the byte-count checks would catch it.
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;
constexpr int64_t kMaxDimExtent = int64_t{1} << 40;
// Arrays reserve at most this many elements up front; longer ones grow as
// they are read, so a lying length costs no more memory than the file holds.
constexpr uint64_t kMaxReserve = uint64_t{1} << 20;

const char* value_type_name(uint32_t t) {
  static const char* names[] = {"uint8", "int8",  "uint16", "int16",  "uint32", "int32", "float32",
                                "bool",  "string", "array", "uint64", "int64",  "float64"};
  return t < 13 ? names[t] : "unknown";
}

// Bounds-checked little-endian cursor over the file bytes. Every read checks
// that the bytes exist first, so a truncated or lying header cannot make us
// read past the end.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& name) : p_(data), size_(size), name_(name) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      fail("{}: truncated file: {} needs {} bytes at offset {}, only {} remain", name_, what, n, pos_,
           remaining());
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > kMaxStringBytes) fail("{}: {} has absurd length {} at offset {}", name_, what, len, pos_ - 8);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& name_;
};

size_t scalar_size(GGUFValueType t) {
  switch (t) {
    case GGUFValueType::UINT8:
    case GGUFValueType::INT8:
    case GGUFValueType::BOOL:
      return 1;
    case GGUFValueType::UINT16:
    case GGUFValueType::INT16:
      return 2;
    case GGUFValueType::UINT32:
    case GGUFValueType::INT32:
    case GGUFValueType::FLOAT32:
      return 4;
    case GGUFValueType::UINT64:
    case GGUFValueType::INT64:
    case GGUFValueType::FLOAT64:
      return 8;
    case GGUFValueType::STRING:
      return 8;  // at least the length prefix
    default:
      return 0;
  }
}

bool is_int_type(GGUFValueType t) {
  switch (t) {
    case GGUFValueType::UINT8:
    case GGUFValueType::INT8:
    case GGUFValueType::UINT16:
    case GGUFValueType::INT16:
    case GGUFValueType::UINT32:
    case GGUFValueType::INT32:
    case GGUFValueType::UINT64:
    case GGUFValueType::INT64:
      return true;
    default:
      return false;
  }
}

// Reads one scalar of type t and returns it widened.
GGUFValue::Scalar read_scalar(Cursor& c, GGUFValueType t, const std::string& key, const std::string& file) {
  switch (t) {
    case GGUFValueType::UINT8: return uint64_t{c.read<uint8_t>("metadata value")};
    case GGUFValueType::INT8: return int64_t{c.read<int8_t>("metadata value")};
    case GGUFValueType::UINT16: return uint64_t{c.read<uint16_t>("metadata value")};
    case GGUFValueType::INT16: return int64_t{c.read<int16_t>("metadata value")};
    case GGUFValueType::UINT32: return uint64_t{c.read<uint32_t>("metadata value")};
    case GGUFValueType::INT32: return int64_t{c.read<int32_t>("metadata value")};
    case GGUFValueType::UINT64: return c.read<uint64_t>("metadata value");
    case GGUFValueType::INT64: return c.read<int64_t>("metadata value");
    case GGUFValueType::FLOAT32: return double{c.read<float>("metadata value")};
    case GGUFValueType::FLOAT64: return c.read<double>("metadata value");
    case GGUFValueType::BOOL: {
      const uint8_t b = c.read<uint8_t>("metadata value");
      if (b > 1) fail("{}: metadata '{}': bool value must be 0 or 1, got {}", file, printable(key), b);
      return b != 0;
    }
    case GGUFValueType::STRING: return c.read_string("metadata string");
    default: fail("{}: metadata '{}': unknown value type {}", file, printable(key), static_cast<uint32_t>(t));
  }
}

int64_t scalar_as_int(const GGUFValue::Scalar& s, const std::string& key, const std::string& file) {
  if (auto* u = std::get_if<uint64_t>(&s)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("{}: metadata '{}': value {} does not fit in int64", file, printable(key), *u);
    return static_cast<int64_t>(*u);
  }
  if (auto* i = std::get_if<int64_t>(&s)) return *i;
  if (auto* b = std::get_if<bool>(&s)) return *b ? 1 : 0;
  fail("{}: metadata '{}' is not an integer", file, printable(key));
}

}  // namespace

GGUFFile::~GGUFFile() = default;

std::unique_ptr<GGUFFile> GGUFFile::open(const std::string& path) {
  auto map = std::make_unique<MappedFile>(path);
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->name_ = path;
  f->parse_all(map->data(), map->size());
  f->map_ = std::move(map);
  return f;
}

std::unique_ptr<GGUFFile> GGUFFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->name_ = name;
  f->parse_all(data, size);
  return f;
}

void GGUFFile::parse_all(const uint8_t* data, size_t size) {
  Cursor c(data, size, name_);
  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0) {
    std::string got;
    for (size_t i = 0; i < std::min<size_t>(size, 4); ++i) got += fmt::format("{:02x}", data[i]);
    fail("{}: not a GGUF file: bad magic (expected 47475546 \"GGUF\", got {})", name_,
         got.empty() ? "an empty file" : got);
  }
  c.read<uint32_t>("magic");
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    fail("{}: unsupported GGUF version {} (expected 3, or the compatible 2)", name_, version_);
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each metadata entry needs at least 13 bytes (key length, type, 1-byte
  // value) and each tensor info at least 24; counts beyond what the file could
  // hold are lies, rejected before anything is reserved.
  if (n_kv > c.remaining() / 13)
    fail("{}: absurd metadata count {}: only {} bytes follow the header (truncated file?)", name_, n_kv, c.remaining());
  if (n_tensors > c.remaining() / 24)
    fail("{}: absurd tensor count {}: only {} bytes follow the header (truncated file?)", name_, n_tensors, c.remaining());

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata key");
    if (kv_.count(key)) fail("{}: duplicate metadata key '{}'", name_, printable(key));
    const uint32_t type_raw = c.read<uint32_t>("metadata type");
    if (type_raw > 12) fail("{}: metadata '{}': unknown value type {}", name_, printable(key), type_raw);
    GGUFValue v;
    v.type = static_cast<GGUFValueType>(type_raw);
    if (v.type == GGUFValueType::ARRAY) {
      const uint32_t et_raw = c.read<uint32_t>("array element type");
      if (et_raw > 12) fail("{}: metadata '{}': unknown array element type {}", name_, printable(key), et_raw);
      v.elem_type = static_cast<GGUFValueType>(et_raw);
      if (v.elem_type == GGUFValueType::ARRAY)
        fail("{}: metadata '{}': nested arrays are not supported", name_, printable(key));
      v.array_len = c.read<uint64_t>("array length");
      const size_t min_elem = scalar_size(v.elem_type);
      if (v.array_len > c.remaining() / min_elem)
        fail("{}: metadata '{}': array of {} {} elements exceeds the {} bytes that remain", name_, printable(key),
             v.array_len, value_type_name(et_raw), c.remaining());
      if (v.elem_type == GGUFValueType::STRING) {
        v.strings.reserve(std::min<uint64_t>(v.array_len, kMaxReserve));
        for (uint64_t j = 0; j < v.array_len; ++j) v.strings.push_back(c.read_string("array string"));
      } else if (v.elem_type == GGUFValueType::FLOAT32 || v.elem_type == GGUFValueType::FLOAT64) {
        v.floats.reserve(std::min<uint64_t>(v.array_len, kMaxReserve));
        for (uint64_t j = 0; j < v.array_len; ++j)
          v.floats.push_back(std::get<double>(read_scalar(c, v.elem_type, key, name_)));
      } else {
        v.ints.reserve(std::min<uint64_t>(v.array_len, kMaxReserve));
        for (uint64_t j = 0; j < v.array_len; ++j)
          v.ints.push_back(scalar_as_int(read_scalar(c, v.elem_type, key, name_), key, name_));
      }
    } else {
      v.scalar = read_scalar(c, v.type, key, name_);
    }
    kv_order_.push_back(key);
    kv_.emplace(std::move(key), std::move(v));
  }

  if (const GGUFValue* a = find("general.alignment")) {
    if (!is_int_type(a->type)) fail("{}: general.alignment must be an integer", name_);
    const int64_t al = scalar_as_int(a->scalar, "general.alignment", name_);
    if (al <= 0 || al > 65536 || (al & (al - 1)) != 0)
      fail("{}: general.alignment must be a power of two in [1, 65536], got {}", name_, al);
    alignment_ = static_cast<uint64_t>(al);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GGUFTensorInfo t;
    t.name = c.read_string("tensor name");
    if (tensor_index_.count(t.name)) fail("{}: duplicate tensor name '{}'", name_, printable(t.name));
    const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      fail("{}: tensor '{}' has {} dimensions (expected 1 to {})", name_, printable(t.name), n_dims, kMaxDims);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t extent = c.read<uint64_t>("tensor dimension");
      if (extent == 0 || extent > static_cast<uint64_t>(kMaxDimExtent))
        fail("{}: tensor '{}' dimension {} has absurd extent {}", name_, printable(t.name), d, extent);
      if (n_el > std::numeric_limits<uint64_t>::max() / extent)
        fail("{}: tensor '{}' element count overflows", name_, printable(t.name));
      n_el *= extent;
      t.shape.push_back(static_cast<int64_t>(extent));
    }
    if (n_el > (uint64_t{1} << 48)) fail("{}: tensor '{}' has absurd element count {}", name_, printable(t.name), n_el);
    const uint32_t type_raw = c.read<uint32_t>("tensor type");
    const auto dt = dtype_from_ggml(type_raw);
    if (!dt)
      fail("{}: tensor '{}' has type {} ({}), which this engine does not support", name_, printable(t.name), type_raw,
           ggml_type_name(type_raw));
    t.type = *dt;
    const auto& tr = dtype_traits(t.type);
    if (t.shape[0] % tr.block_size != 0)
      fail("{}: tensor '{}' row length {} is not a multiple of the {} block size {}", name_, printable(t.name),
           t.shape[0], tr.name, tr.block_size);
    t.n_elements = n_el;
    t.n_bytes = n_el / static_cast<uint64_t>(tr.block_size) * tr.block_bytes;
    t.offset = c.read<uint64_t>("tensor offset");
    if (t.offset % alignment_ != 0)
      fail("{}: tensor '{}' offset {} is not a multiple of the alignment {}", name_, printable(t.name), t.offset,
           alignment_);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_start > size)
    fail("{}: truncated file: data section would start at {} but the file has {} bytes", name_, data_start,
         size);
  const uint64_t data_size = n_tensors > 0 ? size - data_start : 0;
  for (auto& t : tensors_) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      fail("{}: tensor '{}' data [{}, {}) lies outside the data section of {} bytes (truncated file?)", name_,
           printable(t.name), t.offset, t.offset + t.n_bytes, data_size);
    t.data = data + data_start + t.offset;
  }
  // No two tensors may share bytes. A tensor whose type or offset was
  // changed (corruption, a bad edit) almost always lands on a neighbour's
  // data; loading it would give wrong results without any error.
  std::vector<const GGUFTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const GGUFTensorInfo* a, const GGUFTensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->n_bytes < b->n_bytes;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GGUFTensorInfo& a = *by_offset[i - 1];
    const GGUFTensorInfo& b = *by_offset[i];
    if (a.offset + a.n_bytes > b.offset)
      fail("{}: tensor '{}' ({}, {} bytes at data offset {}) overlaps tensor '{}' at data offset {}: the file is "
           "corrupt (a wrong type, shape or offset)",
           name_, printable(a.name), dtype_traits(a.type).name, a.n_bytes, a.offset, printable(b.name), b.offset);
  }
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GGUFTensorInfo& a = *by_offset[i - 1];
    const GGUFTensorInfo& b = *by_offset[i];
    // Writers lay tensors out back to back, each padded to the alignment. A
    // gap beyond that padding means a tensor's type or shape says it is
    // smaller than the space it was written in.
    const uint64_t padded_end = (a.offset + a.n_bytes + alignment_ - 1) / alignment_ * alignment_;
    if (b.offset > padded_end)
      fail("{}: tensor '{}' ({} {}, {} bytes at data offset {}) is followed by {} unaccounted bytes before tensor "
           "'{}': the file is corrupt (a wrong type or shape for '{}'?)",
           name_, printable(a.name), dtype_traits(a.type).name, fmt::format("[{}]", fmt::join(a.shape, ", ")),
           a.n_bytes, a.offset, b.offset - padded_end, printable(b.name), printable(a.name));
  }
}

const GGUFValue* GGUFFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
const GGUFValue& require(const GGUFFile& f, const std::string& key) {
  const GGUFValue* v = f.find(key);
  if (!v) fail("{}: required metadata key '{}' is missing", f.name(), key);
  return *v;
}
}  // namespace

std::optional<std::string> GGUFFile::get_string_opt(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GGUFValueType::STRING)
    fail("{}: metadata '{}' must be a string, got {}", name_, printable(key), value_type_name((uint32_t)v->type));
  return std::get<std::string>(v->scalar);
}
std::string GGUFFile::get_string(const std::string& key) const {
  require(*this, key);
  return *get_string_opt(key);
}
std::optional<int64_t> GGUFFile::get_int_opt(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) return std::nullopt;
  if (!is_int_type(v->type))
    fail("{}: metadata '{}' must be an integer, got {}", name_, printable(key), value_type_name((uint32_t)v->type));
  return scalar_as_int(v->scalar, key, name_);
}
int64_t GGUFFile::get_int(const std::string& key) const {
  require(*this, key);
  return *get_int_opt(key);
}
std::optional<double> GGUFFile::get_float_opt(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type == GGUFValueType::FLOAT32 || v->type == GGUFValueType::FLOAT64) return std::get<double>(v->scalar);
  if (is_int_type(v->type)) return static_cast<double>(scalar_as_int(v->scalar, key, name_));
  fail("{}: metadata '{}' must be a number, got {}", name_, printable(key), value_type_name((uint32_t)v->type));
}
double GGUFFile::get_float(const std::string& key) const {
  require(*this, key);
  return *get_float_opt(key);
}
std::optional<bool> GGUFFile::get_bool_opt(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GGUFValueType::BOOL)
    fail("{}: metadata '{}' must be a bool, got {}", name_, printable(key), value_type_name((uint32_t)v->type));
  return std::get<bool>(v->scalar);
}
const std::vector<std::string>& GGUFFile::get_string_array(const std::string& key) const {
  const GGUFValue& v = require(*this, key);
  if (v.type != GGUFValueType::ARRAY || v.elem_type != GGUFValueType::STRING)
    fail("{}: metadata '{}' must be an array of strings", name_, printable(key));
  return v.strings;
}
const std::vector<int64_t>& GGUFFile::get_int_array(const std::string& key) const {
  const GGUFValue& v = require(*this, key);
  if (v.type != GGUFValueType::ARRAY || !(is_int_type(v.elem_type) || v.elem_type == GGUFValueType::BOOL))
    fail("{}: metadata '{}' must be an array of integers", name_, printable(key));
  return v.ints;
}
const std::vector<double>& GGUFFile::get_float_array(const std::string& key) const {
  const GGUFValue& v = require(*this, key);
  if (v.type != GGUFValueType::ARRAY ||
      (v.elem_type != GGUFValueType::FLOAT32 && v.elem_type != GGUFValueType::FLOAT64))
    fail("{}: metadata '{}' must be an array of floats", name_, printable(key));
  return v.floats;
}

const GGUFTensorInfo* GGUFFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}
const GGUFTensorInfo& GGUFFile::tensor(const std::string& name) const {
  const GGUFTensorInfo* t = find_tensor(name);
  if (!t) fail("{}: tensor '{}' is missing", name_, name);
  return *t;
}

// ---------------------------------------------------------------------------
// Writer

namespace {
template <typename T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t n = b.size();
  b.resize(n + sizeof(T));
  std::memcpy(b.data() + n, &v, sizeof(T));
}
void put_str(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
}  // namespace

void GGUFWriter::put_kv(const std::string& key, std::vector<uint8_t> bytes) {
  for (auto& kv : kvs_)
    if (kv.key == key) {
      kv.bytes = std::move(bytes);
      return;
    }
  kvs_.push_back({key, std::move(bytes)});
}
void GGUFWriter::set_string(const std::string& key, const std::string& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, (uint32_t)GGUFValueType::STRING);
  put_str(b, v);
  put_kv(key, std::move(b));
}
void GGUFWriter::set_u32(const std::string& key, uint32_t v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, (uint32_t)GGUFValueType::UINT32);
  put<uint32_t>(b, v);
  put_kv(key, std::move(b));
}
void GGUFWriter::set_i32(const std::string& key, int32_t v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, (uint32_t)GGUFValueType::INT32);
  put<int32_t>(b, v);
  put_kv(key, std::move(b));
}
void GGUFWriter::set_u64(const std::string& key, uint64_t v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, (uint32_t)GGUFValueType::UINT64);
  put<uint64_t>(b, v);
  put_kv(key, std::move(b));
}
void GGUFWriter::set_f32(const std::string& key, float v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, (uint32_t)GGUFValueType::FLOAT32);
  put<float>(b, v);
  put_kv(key, std::move(b));
}
void GGUFWriter::set_bool(const std::string& key, bool v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, (uint32_t)GGUFValueType::BOOL);
  put<uint8_t>(b, v ? 1 : 0);
  put_kv(key, std::move(b));
}
void GGUFWriter::set_string_array(const std::string& key, const std::vector<std::string>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, (uint32_t)GGUFValueType::ARRAY);
  put<uint32_t>(b, (uint32_t)GGUFValueType::STRING);
  put<uint64_t>(b, v.size());
  for (const auto& s : v) put_str(b, s);
  put_kv(key, std::move(b));
}
void GGUFWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, (uint32_t)GGUFValueType::ARRAY);
  put<uint32_t>(b, (uint32_t)GGUFValueType::INT32);
  put<uint64_t>(b, v.size());
  for (int32_t x : v) put<int32_t>(b, x);
  put_kv(key, std::move(b));
}
void GGUFWriter::set_f32_array(const std::string& key, const std::vector<float>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, (uint32_t)GGUFValueType::ARRAY);
  put<uint32_t>(b, (uint32_t)GGUFValueType::FLOAT32);
  put<uint64_t>(b, v.size());
  for (float x : v) put<float>(b, x);
  put_kv(key, std::move(b));
}

void GGUFWriter::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape,
                            const void* data, size_t bytes) {
  if (shape.empty() || shape.size() > kMaxDims) fail("GGUF writer: tensor '{}' needs 1 to 4 dimensions", name);
  int64_t rows = 1;
  for (size_t i = 1; i < shape.size(); ++i) rows *= shape[i];
  const size_t expect = row_bytes(type, shape[0]) * static_cast<size_t>(rows);
  if (bytes != expect)
    fail("GGUF writer: tensor '{}' has {} bytes of data, its shape and type need {}", name, bytes, expect);
  for (const auto& t : tensors_)
    if (t.name == name) fail("GGUF writer: duplicate tensor '{}'", name);
  const auto* p = static_cast<const uint8_t*>(data);
  tensors_.push_back({name, type, shape, std::vector<uint8_t>(p, p + bytes)});
}

void GGUFWriter::add_tensor_f32(const std::string& name, DType type, const std::vector<int64_t>& shape,
                                const float* data) {
  if (shape.empty()) fail("GGUF writer: tensor '{}' needs a shape", name);
  int64_t rows = 1;
  for (size_t i = 1; i < shape.size(); ++i) rows *= shape[i];
  const size_t rb = row_bytes(type, shape[0]);
  std::vector<uint8_t> q(rb * static_cast<size_t>(rows));
  const auto& tr = dtype_traits(type);
  for (int64_t r = 0; r < rows; ++r) tr.quantize(data + r * shape[0], q.data() + r * rb, shape[0]);
  add_tensor(name, type, shape, q.data(), q.size());
}

std::vector<uint8_t> GGUFWriter::serialize() const {
  std::vector<uint8_t> b;
  b.insert(b.end(), {'G', 'G', 'U', 'F'});
  put<uint32_t>(b, 3);
  put<uint64_t>(b, tensors_.size());
  const bool custom_align = alignment_ != 32;
  put<uint64_t>(b, kvs_.size() + (custom_align ? 1 : 0));
  if (custom_align) {
    put_str(b, "general.alignment");
    put<uint32_t>(b, (uint32_t)GGUFValueType::UINT32);
    put<uint32_t>(b, static_cast<uint32_t>(alignment_));
  }
  for (const auto& kv : kvs_) {
    put_str(b, kv.key);
    b.insert(b.end(), kv.bytes.begin(), kv.bytes.end());
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const auto& t : tensors_) {
    put_str(b, t.name);
    put<uint32_t>(b, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) put<uint64_t>(b, static_cast<uint64_t>(d));
    put<uint32_t>(b, static_cast<uint32_t>(t.type));
    put<uint64_t>(b, offset);
    offsets.push_back(offset);
    offset = (offset + t.data.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  const size_t data_start = (b.size() + alignment_ - 1) / alignment_ * alignment_;
  b.resize(data_start + offset, 0);
  for (size_t i = 0; i < tensors_.size(); ++i)
    std::memcpy(b.data() + data_start + offsets[i], tensors_[i].data.data(), tensors_[i].data.size());
  return b;
}

void GGUFWriter::write(const std::string& path) const {
  const auto bytes = serialize();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot open '{}' for writing", path);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) fail("error while writing '{}'", path);
}

}  // namespace megakern
