#include "io/safetensors.h"
#include "core/units.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "core/error.h"
#include "core/half.h"
#include "io/mmap_file.h"

namespace megakern {

std::optional<DType> safetensors_float_format(const std::string& d) {
  if (d == "F32") return DType::F32;
  if (d == "F16") return DType::F16;
  if (d == "BF16") return DType::BF16;
  return std::nullopt;
}

// Tensor data is read with memcpy into host integers, which matches the file's
// little-endian byte order only on little-endian hosts.
static_assert(std::endian::native == std::endian::little, "safetensors reader assumes a little-endian host");

namespace {

// ordered_json keeps the header's key order, so tensors of zero bytes (which
// share an offset with a neighbour) still come out in a deterministic order.
using ojson = nlohmann::ordered_json;

// The reference implementation refuses headers above 100 MB; a length beyond
// that is a corrupt or hostile file, not a real model.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeInfo {
  const char* name;
  size_t bytes;
};

// Every byte-aligned dtype the format defines. Sub-byte formats (F4, F6_*)
// have no whole-byte element size and are deliberately absent, so they are
// reported as unknown rather than mis-sized.
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 1},    {"U8", 1},      {"I8", 1},      {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
    {"I16", 2},     {"U16", 2},     {"F16", 2},     {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},     {"I64", 8},     {"U64", 8},     {"F64", 8},
};

std::string known_dtypes() {
  std::string s;
  for (const DTypeInfo& d : kDTypes) {
    if (!s.empty()) s += ", ";
    s += d.name;
  }
  return s;
}

// A short rendering of a JSON value for error messages: its type and, cut to a
// readable length, its text ("string \"abc\"", "number -3", "array [1,2]").
template <typename Json>
std::string describe(const Json& j) {
  std::string text = j.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return fmt::format("{} {}", j.type_name(), text);
}

// A non-negative JSON integer as u64, or nothing. Floats (including integral
// ones such as 4.0, and integers too large for u64, which the JSON library
// stores as floats) are rejected: offsets and dimensions must be exact.
template <typename Json>
std::optional<uint64_t> as_u64(const Json& j) {
  if (j.is_number_unsigned()) return j.template get<uint64_t>();
  if (j.is_number_integer()) {
    const int64_t v = j.template get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

// Parses JSON text and rejects duplicate keys anywhere in it. The JSON library
// keeps the last of duplicate keys silently, which would let two header
// entries for one tensor name hide each other; the parse callback sees every
// key, so duplicates are collected there and reported after the parse.
ojson parse_json_strict(const char* begin, const char* end, const std::string& what, const std::string& file) {
  struct Frame {
    bool is_object = false;
    std::set<std::string> keys;
    std::string owner;     // the key this container is the value of ("" for the root)
    std::string last_key;  // the key whose value is being parsed, for nested containers
  };
  std::vector<Frame> stack;
  std::string duplicate;  // first problem found, reported after parsing

  ojson::parser_callback_t cb = [&](int /*depth*/, nlohmann::json::parse_event_t event, ojson& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start: {
        Frame f;
        f.is_object = event == E::object_start;
        if (!stack.empty()) f.owner = stack.back().is_object ? stack.back().last_key : stack.back().owner + "[]";
        stack.push_back(std::move(f));
        break;
      }
      case E::object_end:
      case E::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case E::key: {
        if (stack.empty()) break;
        Frame& top = stack.back();
        std::string key = parsed.template get<std::string>();
        if (duplicate.empty() && !top.keys.insert(key).second) {
          duplicate = stack.size() == 1 ? fmt::format("duplicate name '{}' in the {}", key, what)
                                        : fmt::format("duplicate key '{}' inside '{}' in the {}", key, top.owner, what);
        }
        top.last_key = std::move(key);
        break;
      }
      case E::value:
        break;
    }
    return true;
  };

  if (begin == end) fail("{}: {} is empty (0 bytes), expected a JSON object", file, what);
  ojson root;
  try {
    root = ojson::parse(begin, end, cb);
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann prefixes "[json.exception.parse_error.101] "; the tag means
    // nothing to a user, the rest ("parse error at line 1, column 7: ...") does.
    std::string_view msg = e.what();
    if (const size_t close = msg.find("] "); msg.starts_with("[json.exception.") && close != std::string_view::npos)
      msg.remove_prefix(close + 2);
    fail("{}: {} ({} bytes) is malformed JSON at byte {}: {}", file, what, end - begin, e.byte, msg);
  }
  if (!duplicate.empty()) fail("{}: {}", file, duplicate);
  return root;
}

}  // namespace

size_t safetensors_dtype_bytes(const std::string& dtype) {
  for (const DTypeInfo& d : kDTypes)
    if (dtype == d.name) return d.bytes;
  return 0;
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::~SafetensorsFile() = default;

void SafetensorsFile::release_table() {
  std::vector<SafetensorsTensor>().swap(tensors_);
  index_.clear();
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = path;
  f->map_ = std::make_unique<MappedFile>(path);
  f->parse_all(f->map_->data(), f->map_->size());
  return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = name;
  f->parse_all(data, size);
  return f;
}

void SafetensorsFile::parse_all(const uint8_t* data, size_t size) {
  const std::string& file = name_;
  if (size < 8)
    fail("{}: file is {} bytes, shorter than the 8-byte header length that starts a safetensors file", file, size);
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  const uint64_t after_prefix = size - 8;
  // The absurd-length check comes first: a huge N is usually not a
  // safetensors file at all, which says more than "exceeds the file size".
  if (n > kMaxHeaderBytes)
    fail("{}: header length {} is absurd: the format allows at most {} bytes (not a safetensors file?)", file, n,
         kMaxHeaderBytes);
  if (n > after_prefix)
    fail("{}: header length {} exceeds the {} bytes that follow the 8-byte prefix (file is {} bytes; truncated?)",
         file, n, after_prefix, size);
  header_bytes_ = n;
  data_bytes_ = after_prefix - n;
  const uint8_t* buffer = data + 8 + n;

  const char* hbegin = reinterpret_cast<const char*>(data + 8);
  const ojson root = parse_json_strict(hbegin, hbegin + n, "header", file);
  if (!root.is_object()) fail("{}: header must be a JSON object, got {}", file, describe(root));

  // Extents as read from the header, before the buffer-wide checks.
  struct Extent {
    uint64_t begin, end;
    size_t header_pos;
  };
  std::vector<SafetensorsTensor> parsed;
  std::vector<Extent> extents;

  for (const auto& [key, entry] : root.items()) {
    if (key == "__metadata__") {
      if (!entry.is_object()) fail("{}: '__metadata__' must be an object of strings, got {}", file, describe(entry));
      for (const auto& [mk, mv] : entry.items()) {
        if (!mv.is_string())
          fail("{}: '__metadata__' value for '{}' must be a string, got {}", file, mk, describe(mv));
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string& tname = key;
    if (!entry.is_object()) fail("{}: tensor '{}': entry must be an object, got {}", file, tname, describe(entry));
    for (const auto& [field, value] : entry.items()) {
      (void)value;
      if (field != "dtype" && field != "shape" && field != "data_offsets")
        fail("{}: tensor '{}': unexpected field '{}' (expected exactly dtype, shape, data_offsets)", file, tname, field);
    }
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(field)) fail("{}: tensor '{}': missing field '{}'", file, tname, field);

    SafetensorsTensor t;
    t.name = tname;

    const ojson& jd = entry["dtype"];
    if (!jd.is_string()) fail("{}: tensor '{}': field 'dtype' must be a string, got {}", file, tname, describe(jd));
    t.dtype = jd.get<std::string>();
    t.elem_bytes = safetensors_dtype_bytes(t.dtype);
    if (t.elem_bytes == 0)
      fail("{}: tensor '{}': unknown dtype '{}' (expected one of {})", file, tname, t.dtype, known_dtypes());

    const ojson& js = entry["shape"];
    if (!js.is_array())
      fail("{}: tensor '{}': field 'shape' must be an array of integers, got {}", file, tname, describe(js));
    // The element count is kept below 2^63 so numel() and byte sizes fit int64.
    uint64_t numel = 1;
    for (size_t i = 0; i < js.size(); ++i) {
      const std::optional<uint64_t> d = as_u64(js[i]);
      if (!d) fail("{}: tensor '{}': shape[{}] must be a non-negative integer, got {}", file, tname, i, describe(js[i]));
      if (*d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(numel, *d, &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("{}: tensor '{}': shape {} overflows: more than 2^63-1 elements", file, tname, js.dump());
      t.shape.push_back(static_cast<int64_t>(*d));
    }
    uint64_t need = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(t.elem_bytes), &need))
      fail("{}: tensor '{}': shape {} of {} overflows: more than 2^64-1 bytes", file, tname, shape_str(t.shape),
           t.dtype);

    const ojson& jo = entry["data_offsets"];
    if (!jo.is_array() || jo.size() != 2)
      fail("{}: tensor '{}': field 'data_offsets' must be an array of two integers [begin, end], got {}", file,
           tname, describe(jo));
    const std::optional<uint64_t> begin = as_u64(jo[0]);
    const std::optional<uint64_t> end = as_u64(jo[1]);
    if (!begin || !end)
      fail("{}: tensor '{}': data_offsets must be two non-negative integers, got {}", file, tname, jo.dump());
    if (*begin > *end)
      fail("{}: tensor '{}': data_offsets [{}, {}] must be increasing (begin <= end)", file, tname, *begin, *end);
    if (*end - *begin != need)
      fail("{}: tensor '{}': data_offsets [{}, {}] span {} bytes, but shape {} of {} ({} bytes each) needs {}", file,
           tname, *begin, *end, *end - *begin, shape_str(t.shape), t.dtype, t.elem_bytes, need);
    if (*end > data_bytes_)
      fail("{}: tensor '{}': data [{}, {}) runs past the end of the file: the data buffer holds only {} bytes", file,
           tname, *begin, *end, data_bytes_);
    t.data = buffer + *begin;
    t.n_bytes = static_cast<size_t>(need);
    extents.push_back({*begin, *end, parsed.size()});
    parsed.push_back(std::move(t));
  }

  // Buffer-wide checks. Sorting by (begin, end) puts a zero-byte tensor before
  // a tensor that starts at the same offset; the stable sort keeps header
  // order for exact ties. Walking in that order, each tensor must start exactly
  // where the covered prefix ends: earlier is an overlap, later is a hole.
  std::stable_sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Extent* prev = nullptr;
  for (const Extent& e : extents) {
    const std::string& tname = parsed[e.header_pos].name;
    if (e.begin < covered)
      fail("{}: tensor '{}' (bytes [{}, {})) overlaps tensor '{}' (bytes [{}, {}))", file, tname, e.begin, e.end,
           parsed[prev->header_pos].name, prev->begin, prev->end);
    if (e.begin > covered)
      fail("{}: tensor '{}' starts at byte {} but the data before it ends at byte {}: a hole of {} bytes (the format "
           "requires the data buffer to be fully indexed)",
           file, tname, e.begin, covered, e.begin - covered);
    covered = e.end;
    prev = &e;
  }
  if (covered != data_bytes_)
    fail("{}: the data buffer holds {} bytes but the tensors cover only {}: {} trailing bytes are not indexed", file,
         data_bytes_, covered, data_bytes_ - covered);

  tensors_.reserve(parsed.size());
  for (const Extent& e : extents) {
    index_.emplace(parsed[e.header_pos].name, tensors_.size());
    tensors_.push_back(std::move(parsed[e.header_pos]));
  }
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensor& SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsTensor* t = find(name);
  if (t == nullptr) fail("{}: no tensor named '{}' (the file has {} tensors)", name_, name, tensors_.size());
  return *t;
}

// ---------------------------------------------------------------------------
// SafetensorsModel

namespace {

namespace fs = std::filesystem;

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '{}': {}", path.string(), std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read '{}'", path.string());
  return ss.str();
}

// Shard names come from a file we do not trust; they must stay inside the
// checkpoint directory.
void check_shard_name(const std::string& index, const std::string& tensor, const std::string& shard) {
  if (shard.empty()) fail("{}: weight_map entry for tensor '{}' names an empty shard file", index, tensor);
  const fs::path p(shard);
  if (p.is_absolute())
    fail("{}: weight_map entry for tensor '{}' names shard '{}' by an absolute path; shards must be relative to the "
         "index's directory",
         index, tensor, shard);
  for (const fs::path& part : p)
    if (part == "..")
      fail("{}: weight_map entry for tensor '{}' names shard '{}', which leaves the index's directory", index, tensor,
           shard);
}

}  // namespace

SafetensorsModel::SafetensorsModel(SafetensorsModel&&) noexcept = default;
SafetensorsModel& SafetensorsModel::operator=(SafetensorsModel&&) noexcept = default;
SafetensorsModel::~SafetensorsModel() = default;

void SafetensorsModel::release_tables() {
  std::vector<const SafetensorsTensor*>().swap(tensors_);
  index_.clear();
  for (auto& f : files_) f->release_table();
}

void SafetensorsModel::add_file(std::unique_ptr<SafetensorsFile> file) {
  const size_t fi = files_.size();
  for (const SafetensorsTensor& t : file->tensors()) {
    index_.emplace(t.name, std::make_pair(&t, fi));
    tensors_.push_back(&t);
  }
  files_.push_back(std::move(file));
}

SafetensorsModel SafetensorsModel::from_file(std::unique_ptr<SafetensorsFile> file, const std::string& path) {
  SafetensorsModel m;
  m.path_ = path;
  m.metadata_ = file->metadata();
  m.add_file(std::move(file));
  return m;
}

SafetensorsModel SafetensorsModel::open(const std::string& path_or_dir) {
  SafetensorsModel m;
  m.path_ = path_or_dir;

  std::error_code ec;
  const fs::path given(path_or_dir);
  const fs::file_status st = fs::status(given, ec);
  if (ec || !fs::exists(st)) fail("{}: no such file or directory", path_or_dir);

  fs::path index_path;
  if (fs::is_directory(st)) {
    const fs::path single = given / "model.safetensors";
    const fs::path index = given / "model.safetensors.index.json";
    if (fs::exists(single)) {
      std::unique_ptr<SafetensorsFile> f = SafetensorsFile::open(single.string());
      m.metadata_ = f->metadata();
      m.add_file(std::move(f));
      return m;
    }
    if (!fs::exists(index)) {
      // List what is there, since a checkpoint under another name (for example
      // consolidated.safetensors) is the usual cause.
      std::vector<std::string> found;
      for (const fs::directory_entry& de : fs::directory_iterator(given, ec)) {
        const std::string fname = de.path().filename().string();
        if (fname.ends_with(".safetensors") || fname.ends_with(".safetensors.index.json")) found.push_back(fname);
      }
      std::sort(found.begin(), found.end());
      fail("{}: directory has neither model.safetensors nor model.safetensors.index.json{}", path_or_dir,
           found.empty() ? std::string(" (and no other .safetensors files)")
                         : fmt::format(" (found: {})", fmt::join(found, ", ")));
    }
    index_path = index;
  } else if (path_or_dir.ends_with(".json")) {
    index_path = given;
  } else {
    std::unique_ptr<SafetensorsFile> f = SafetensorsFile::open(path_or_dir);
    m.metadata_ = f->metadata();
    m.add_file(std::move(f));
    return m;
  }

  // Sharded checkpoint: {"metadata": {...}, "weight_map": {tensor: shard}}.
  const std::string iname = index_path.string();
  const std::string text = read_text_file(index_path);
  const ojson root = parse_json_strict(text.data(), text.data() + text.size(), "index", iname);
  if (!root.is_object()) fail("{}: index must be a JSON object, got {}", iname, describe(root));
  if (!root.contains("weight_map")) fail("{}: index has no 'weight_map'", iname);
  const ojson& wm = root["weight_map"];
  if (!wm.is_object())
    fail("{}: 'weight_map' must be an object mapping tensor names to shard files, got {}", iname, describe(wm));
  if (wm.empty()) fail("{}: 'weight_map' is empty", iname);
  if (root.contains("metadata")) {
    const ojson& md = root["metadata"];
    if (!md.is_object() && !md.is_null()) fail("{}: 'metadata' must be an object, got {}", iname, describe(md));
    if (md.is_object())
      for (const auto& [k, v] : md.items()) m.metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }

  // Shards in the order the index first names them, each opened once.
  std::vector<std::string> shards;
  std::map<std::string, std::vector<std::string>> shard_tensors;  // shard -> tensors the index puts there
  for (const auto& [tname, jshard] : wm.items()) {
    if (!jshard.is_string())
      fail("{}: weight_map entry for tensor '{}' must be a shard file name (string), got {}", iname, tname,
           describe(jshard));
    const std::string shard = jshard.get<std::string>();
    check_shard_name(iname, tname, shard);
    auto [it, inserted] = shard_tensors.try_emplace(shard);
    if (inserted) shards.push_back(shard);
    it->second.push_back(tname);
  }

  const fs::path dir = index_path.parent_path();
  for (const std::string& shard : shards) {
    const std::vector<std::string>& names = shard_tensors[shard];
    const fs::path spath = dir / shard;
    if (!fs::is_regular_file(spath))
      fail("{}: shard '{}' (listed for {} tensors, e.g. '{}') is missing: {} does not exist", iname, shard,
           names.size(), names.front(), spath.string());
    std::unique_ptr<SafetensorsFile> f = SafetensorsFile::open(spath.string());
    const size_t fi = m.files_.size();
    for (const std::string& tname : names) {
      const SafetensorsTensor* t = f->find(tname);
      if (t == nullptr)
        fail("{}: the index puts tensor '{}' in shard '{}', but that shard has no such tensor ({} has {} tensors)",
             iname, tname, shard, spath.string(), f->tensors().size());
      m.index_.emplace(tname, std::make_pair(t, fi));
    }
    // Visible tensors in the shard's file order, restricted to those the index lists.
    for (const SafetensorsTensor& t : f->tensors()) {
      const auto it = m.index_.find(t.name);
      if (it != m.index_.end() && it->second.first == &t) m.tensors_.push_back(&t);
    }
    m.files_.push_back(std::move(f));
  }
  return m;
}

const SafetensorsTensor* SafetensorsModel::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second.first;
}

const SafetensorsTensor& SafetensorsModel::tensor(const std::string& name) const {
  const SafetensorsTensor* t = find(name);
  if (t == nullptr)
    fail("{}: no tensor named '{}' (the model has {} tensors in {} file{})", path_, name, tensors_.size(),
         files_.size(), files_.size() == 1 ? "" : "s");
  return *t;
}

const SafetensorsFile& SafetensorsModel::file_of(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail("{}: no tensor named '{}'", path_, name);
  return *files_[it->second.second];
}

// ---------------------------------------------------------------------------
// Conversion to f32

float f8_e4m3_to_f32(uint8_t v) {
  const bool neg = (v & 0x80u) != 0;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  float mag;
  if (exp == 0xf && mant == 0x7) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^(1-7)
  } else {
    mag = std::ldexp(static_cast<float>(8 + mant), exp - 7 - 3);  // (1 + mant/8) * 2^(exp-7)
  }
  return neg ? -mag : mag;
}

// E5M2 has the sign, exponent width and bias of IEEE half, so it is exactly
// the high byte of a binary16 value.
float f8_e5m2_to_f32(uint8_t v) { return f16_to_f32(static_cast<uint16_t>(v << 8)); }

float f8_e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

namespace {

template <typename T>
T load(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void convert_plain(const uint8_t* p, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(load<T>(p, i));
}

template <typename Fn>
void convert_u8(const uint8_t* p, float* out, size_t n, Fn fn) {
  for (size_t i = 0; i < n; ++i) out[i] = fn(p[i]);
}

template <typename Fn>
void convert_u16(const uint8_t* p, float* out, size_t n, Fn fn) {
  for (size_t i = 0; i < n; ++i) out[i] = fn(load<uint16_t>(p, i));
}

}  // namespace

std::vector<float> to_f32(const SafetensorsTensor& t) {
  const size_t eb = safetensors_dtype_bytes(t.dtype);
  if (eb == 0) fail("tensor '{}': cannot convert dtype '{}' to f32 (supported: {})", t.name, t.dtype, known_dtypes());
  if (t.elem_bytes != eb)
    fail("tensor '{}': elem_bytes is {} but dtype {} has {}-byte elements", t.name, t.elem_bytes, t.dtype, eb);
  // The view may be hand-built, so its consistency is checked, not assumed.
  uint64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
      fail("tensor '{}': invalid shape {}", t.name, shape_str(t.shape));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(eb), &bytes) || bytes != t.n_bytes)
    fail("tensor '{}': n_bytes is {} but shape {} of {} needs {}", t.name, t.n_bytes, shape_str(t.shape), t.dtype,
         n * eb);
  if (bytes > 0 && t.data == nullptr) fail("tensor '{}': data is null", t.name);

  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* p = t.data;
  const std::string_view dt = t.dtype;
  float* o = out.data();
  const size_t cnt = out.size();
  if (dt == "F32") {
    if (cnt > 0) std::memcpy(o, p, cnt * 4);
  } else if (dt == "F64") {
    convert_plain<double>(p, o, cnt);
  } else if (dt == "F16") {
    convert_u16(p, o, cnt, f16_to_f32);
  } else if (dt == "BF16") {
    convert_u16(p, o, cnt, bf16_to_f32);
  } else if (dt == "F8_E4M3") {
    convert_u8(p, o, cnt, f8_e4m3_to_f32);
  } else if (dt == "F8_E5M2") {
    convert_u8(p, o, cnt, f8_e5m2_to_f32);
  } else if (dt == "F8_E8M0") {
    convert_u8(p, o, cnt, f8_e8m0_to_f32);
  } else if (dt == "BOOL") {
    convert_u8(p, o, cnt, [](uint8_t v) { return v != 0 ? 1.0f : 0.0f; });
  } else if (dt == "U8") {
    convert_plain<uint8_t>(p, o, cnt);
  } else if (dt == "I8") {
    convert_plain<int8_t>(p, o, cnt);
  } else if (dt == "I16") {
    convert_plain<int16_t>(p, o, cnt);
  } else if (dt == "U16") {
    convert_plain<uint16_t>(p, o, cnt);
  } else if (dt == "I32") {
    convert_plain<int32_t>(p, o, cnt);
  } else if (dt == "U32") {
    convert_plain<uint32_t>(p, o, cnt);
  } else if (dt == "I64") {
    convert_plain<int64_t>(p, o, cnt);
  } else if (dt == "U64") {
    convert_plain<uint64_t>(p, o, cnt);
  } else {
    // Reached only if the dtype table gains an entry without a converter.
    fail("tensor '{}': cannot convert dtype '{}' to f32", t.name, t.dtype);
  }
  return out;
}

}  // namespace megakern
