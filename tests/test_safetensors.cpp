// Tests of the safetensors reader: round trips through bytes built here, the
// sharded-checkpoint loader, and one test per validation failure checking that
// the message names the problem.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "io/safetensors.h"

namespace megakern {
namespace {

namespace fs = std::filesystem;

// The message of the megakern::Error that fn throws ("" plus a test failure
// when it throws nothing).
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a megakern::Error";
  return "";
}

// Expects stmt to throw megakern::Error whose message contains every one of
// the given substrings.
#define EXPECT_ERROR_HAS(stmt, ...)                                                                \
  do {                                                                                             \
    const std::string msg_ = error_message([&] { stmt; });                                         \
    for (std::string_view sub_ : std::initializer_list<std::string_view>{__VA_ARGS__})             \
      EXPECT_NE(msg_.find(sub_), std::string::npos) << "message: " << msg_ << "\nmissing: " << sub_; \
  } while (0)

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Assembles safetensors bytes: the 8-byte length, the header padded with
// spaces to a multiple of 8 (as the reference writer does), then the data.
std::vector<uint8_t> assemble(const std::string& header, const std::vector<uint8_t>& data) {
  std::string h = header;
  while (h.size() % 8 != 0) h.push_back(' ');
  const uint64_t n = h.size();
  std::vector<uint8_t> out(8);
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Builds a well-formed file: tensors are laid out back to back in the order
// added, so data order equals insertion order.
class Builder {
 public:
  Builder& add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
               const std::vector<uint8_t>& bytes) {
    header_[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data_.size(), data_.size() + bytes.size()}}};
    data_.insert(data_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  Builder& meta(const std::string& k, const std::string& v) {
    header_["__metadata__"][k] = v;
    return *this;
  }
  std::vector<uint8_t> build() const { return assemble(header_.dump(), data_); }

 private:
  nlohmann::ordered_json header_ = nlohmann::ordered_json::object();
  std::vector<uint8_t> data_;
};

// A fresh directory under the system temp directory, removed afterwards.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("megakern_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    const fs::path p = path_ / name;
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }
  std::string write(const std::string& name, const std::string& text) const {
    return write(name, std::vector<uint8_t>(text.begin(), text.end()));
  }

 private:
  fs::path path_;
};

std::unique_ptr<SafetensorsFile> parse(const std::vector<uint8_t>& b) {
  return SafetensorsFile::parse(b.data(), b.size(), "test.safetensors");
}

// A one-tensor file with the given header entry and data size.
std::vector<uint8_t> one_entry(const std::string& entry_json, size_t data_bytes) {
  return assemble("{\"w\":" + entry_json + "}", std::vector<uint8_t>(data_bytes, 0));
}

// --- Round trips ------------------------------------------------------------

TEST(Safetensors, RoundTripF32) {
  const std::vector<float> w = {1.0f, -2.5f, 3.25f, 0.0f, 1e-8f, -1e8f};
  const auto b = Builder().add("w", "F32", {2, 3}, bytes_of(w)).build();
  const auto f = parse(b);
  ASSERT_EQ(f->tensors().size(), 1u);
  const SafetensorsTensor& t = f->tensor("w");
  EXPECT_EQ(t.name, "w");
  EXPECT_EQ(t.dtype, "F32");
  EXPECT_EQ(t.elem_bytes, 4u);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.n_bytes, 24u);
  EXPECT_EQ(to_f32(t), w);
}

TEST(Safetensors, RoundTripF16BF16F64) {
  const std::vector<float> vals = {1.0f, -0.5f, 65504.0f, 0.099975586f, -3.0f, 6.1035156e-05f};
  std::vector<uint16_t> h, bf;
  std::vector<double> d;
  for (float v : vals) {
    h.push_back(f32_to_f16(v));
    bf.push_back(f32_to_bf16(v));
    d.push_back(v);
  }
  const auto b = Builder()
                     .add("h", "F16", {6}, bytes_of(h))
                     .add("bf", "BF16", {3, 2}, bytes_of(bf))
                     .add("d", "F64", {1, 6}, bytes_of(d))
                     .build();
  const auto f = parse(b);
  const std::vector<float> fh = to_f32(f->tensor("h"));
  const std::vector<float> fbf = to_f32(f->tensor("bf"));
  const std::vector<float> fd = to_f32(f->tensor("d"));
  for (size_t i = 0; i < vals.size(); ++i) {
    EXPECT_EQ(fh[i], f16_to_f32(h[i])) << i;
    EXPECT_NEAR(fh[i], vals[i], std::abs(vals[i]) * 1e-3f) << i;
    EXPECT_EQ(fbf[i], bf16_to_f32(bf[i])) << i;
    EXPECT_NEAR(fbf[i], vals[i], std::abs(vals[i]) * 1e-2f) << i;
    EXPECT_EQ(fd[i], vals[i]) << i;
  }
  EXPECT_EQ(f->tensor("h").elem_bytes, 2u);
  EXPECT_EQ(f->tensor("d").elem_bytes, 8u);
}

TEST(Safetensors, RoundTripIntegersAndBool) {
  const std::vector<int8_t> i8 = {-128, -1, 0, 127};
  const std::vector<uint8_t> u8 = {0, 1, 200, 255};
  const std::vector<int16_t> i16 = {-32768, 7, 32767, 0};
  const std::vector<uint16_t> u16 = {0, 65535, 3, 9};
  const std::vector<int32_t> i32 = {-100000, 5, 1 << 20, 0};
  const std::vector<uint32_t> u32 = {4000000000u, 0, 1, 2};
  const std::vector<int64_t> i64 = {-(int64_t(1) << 40), 42, 0, 1};
  const std::vector<uint64_t> u64 = {uint64_t(1) << 50, 0, 3, 4};
  const std::vector<uint8_t> boolean = {0, 1, 1, 0};
  const auto b = Builder()
                     .add("i8", "I8", {4}, bytes_of(i8))
                     .add("u8", "U8", {4}, bytes_of(u8))
                     .add("i16", "I16", {2, 2}, bytes_of(i16))
                     .add("u16", "U16", {4}, bytes_of(u16))
                     .add("i32", "I32", {4}, bytes_of(i32))
                     .add("u32", "U32", {4}, bytes_of(u32))
                     .add("i64", "I64", {4}, bytes_of(i64))
                     .add("u64", "U64", {4}, bytes_of(u64))
                     .add("b", "BOOL", {4}, boolean)
                     .build();
  const auto f = parse(b);
  auto check = [&](const std::string& name, auto expected) {
    const std::vector<float> got = to_f32(f->tensor(name));
    ASSERT_EQ(got.size(), expected.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<float>(expected[i])) << name << "[" << i << "]";
  };
  check("i8", i8);
  check("u8", u8);
  check("i16", i16);
  check("u16", u16);
  check("i32", i32);
  check("u32", u32);
  check("i64", i64);
  check("u64", u64);
  check("b", boolean);
  EXPECT_EQ(f->tensor("i64").elem_bytes, 8u);
}

TEST(Safetensors, RoundTripFp8) {
  // E4M3: 0x38 = 1.0, 0x7e = 448 (the largest finite), 0x01 = 2^-9 (smallest
  // subnormal), 0xc0 = -2, 0x7f = NaN. E5M2: 0x3c = 1.0, 0x7c = inf,
  // 0x01 = 2^-16. E8M0: 127 = 1, 130 = 8, 0 = 2^-127, 255 = NaN.
  const std::vector<uint8_t> e4 = {0x38, 0x7e, 0x01, 0xc0, 0x7f};
  const std::vector<uint8_t> e5 = {0x3c, 0x7c, 0x01, 0xc0, 0x7f};
  const std::vector<uint8_t> e8 = {127, 130, 0, 126, 255};
  const auto b = Builder()
                     .add("e4", "F8_E4M3", {5}, e4)
                     .add("e5", "F8_E5M2", {5}, e5)
                     .add("e8", "F8_E8M0", {5}, e8)
                     .build();
  const auto f = parse(b);
  const auto a = to_f32(f->tensor("e4"));
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[1], 448.0f);
  EXPECT_EQ(a[2], std::ldexp(1.0f, -9));
  EXPECT_EQ(a[3], -2.0f);
  EXPECT_TRUE(std::isnan(a[4]));
  const auto c = to_f32(f->tensor("e5"));
  EXPECT_EQ(c[0], 1.0f);
  EXPECT_EQ(c[1], std::numeric_limits<float>::infinity());
  EXPECT_EQ(c[2], std::ldexp(1.0f, -16));
  EXPECT_EQ(c[3], -2.0f);
  EXPECT_TRUE(std::isnan(c[4]));
  const auto e = to_f32(f->tensor("e8"));
  EXPECT_EQ(e[0], 1.0f);
  EXPECT_EQ(e[1], 8.0f);
  EXPECT_EQ(e[2], std::ldexp(1.0f, -127));
  EXPECT_EQ(e[3], 0.5f);
  EXPECT_TRUE(std::isnan(e[4]));
}

TEST(Safetensors, Fp8E4M3MatchesFormula) {
  // Every finite E4M3 value is (-1)^s * 2^(e-7) * (1 + m/8), or a subnormal
  // 2^-6 * m/8; checking all 256 codes guards the bit manipulation.
  for (int v = 0; v < 256; ++v) {
    const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    const float got = f8_e4m3_to_f32(static_cast<uint8_t>(v));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(got)) << v;
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    EXPECT_EQ(got, static_cast<float>(s ? -mag : mag)) << v;
  }
}

TEST(Safetensors, ScalarAndEmptyTensors) {
  const std::vector<float> one = {7.5f};
  const auto b = Builder()
                     .add("scalar", "F32", {}, bytes_of(one))
                     .add("empty", "F16", {0, 3}, {})
                     .add("after", "U8", {2}, {9, 8})
                     .build();
  const auto f = parse(b);
  const SafetensorsTensor& s = f->tensor("scalar");
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(to_f32(s), one);
  const SafetensorsTensor& e = f->tensor("empty");
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.n_bytes, 0u);
  EXPECT_TRUE(to_f32(e).empty());
  EXPECT_EQ(to_f32(f->tensor("after")), (std::vector<float>{9, 8}));
}

TEST(Safetensors, TensorsAreInDataOrderAndMetadataIsRead) {
  // The header lists "b" first but its data comes second.
  const std::string header =
      R"({"__metadata__":{"format":"pt","note":"x"},)"
      R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]},)"
      R"("a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
  const auto b = assemble(header, {1, 2, 3, 4, 5});
  const auto f = parse(b);
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "a");
  EXPECT_EQ(f->tensors()[1].name, "b");
  EXPECT_EQ(f->tensor("b").data[0], 4);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "x");
  EXPECT_EQ(f->data_bytes(), 5u);
}

TEST(Safetensors, OpenMapsAFileFromDisk) {
  TempDir dir;
  const std::vector<float> w = {1, 2, 3, 4};
  const std::string path = dir.write("x.safetensors", Builder().add("w", "F32", {4}, bytes_of(w)).meta("k", "v").build());
  const auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->name(), path);
  EXPECT_EQ(to_f32(f->tensor("w")), w);
  EXPECT_EQ(f->metadata().at("k"), "v");
  EXPECT_ERROR_HAS(SafetensorsFile::open((dir.path() / "nope.safetensors").string()), "nope.safetensors");
}

TEST(Safetensors, FindAndMissingTensor) {
  const auto f = parse(Builder().add("w", "U8", {1}, {1}).build());
  EXPECT_NE(f->find("w"), nullptr);
  EXPECT_EQ(f->find("v"), nullptr);
  EXPECT_ERROR_HAS(f->tensor("missing.weight"), "test.safetensors", "missing.weight");
}

// --- Validation failures ----------------------------------------------------

TEST(SafetensorsErrors, FileShorterThanPrefix) {
  const std::vector<uint8_t> b = {1, 2, 3};
  EXPECT_ERROR_HAS(parse(b), "test.safetensors", "3 bytes", "shorter than the 8-byte");
}

TEST(SafetensorsErrors, HeaderLengthPastEndOfFile) {
  std::vector<uint8_t> b = assemble("{}", {});
  const uint64_t n = 1000;
  std::memcpy(b.data(), &n, 8);
  EXPECT_ERROR_HAS(parse(b), "test.safetensors", "header length 1000 exceeds the 8 bytes");
}

TEST(SafetensorsErrors, HeaderLengthAbsurd) {
  std::vector<uint8_t> b = assemble("{}", {});
  const uint64_t n = uint64_t(1) << 40;
  std::memcpy(b.data(), &n, 8);
  EXPECT_ERROR_HAS(parse(b), "header length 1099511627776 is absurd", "at most 100000000");
}

TEST(SafetensorsErrors, MalformedJsonReportsPosition) {
  EXPECT_ERROR_HAS(parse(assemble(R"({"w": {"dtype": "F32",, }})", {})), "test.safetensors",
                   "header (32 bytes) is malformed JSON at byte", "column 23");
}

TEST(SafetensorsErrors, InvalidUtf8InHeader) {
  EXPECT_ERROR_HAS(parse(assemble("{\"w\xff\": {}}", {})), "malformed JSON");
}

TEST(SafetensorsErrors, HeaderNotAnObject) {
  EXPECT_ERROR_HAS(parse(assemble("[1, 2]", {})), "header must be a JSON object, got array");
  // A zero-length header is reported as such rather than as a parse error.
  std::vector<uint8_t> empty(8, 0);
  EXPECT_ERROR_HAS(parse(empty), "header is empty");
}

TEST(SafetensorsErrors, EntryNotAnObject) {
  EXPECT_ERROR_HAS(parse(one_entry("[1]", 0)), "tensor 'w'", "entry must be an object, got array");
}

TEST(SafetensorsErrors, MissingField) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":[1]})", 4)), "tensor 'w'",
                   "missing field 'data_offsets'");
}

TEST(SafetensorsErrors, ExtraField) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"stride":[1]})", 4)),
                   "tensor 'w'", "unexpected field 'stride'");
}

TEST(SafetensorsErrors, DtypeNotAString) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":0,"shape":[1],"data_offsets":[0,4]})", 4)),
                   "field 'dtype' must be a string, got number 0");
}

TEST(SafetensorsErrors, UnknownDtype) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"Q4_0","shape":[1],"data_offsets":[0,4]})", 4)),
                   "tensor 'w'", "unknown dtype 'Q4_0'", "BF16");
}

TEST(SafetensorsErrors, ShapeNotAnArray) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":4,"data_offsets":[0,4]})", 4)),
                   "field 'shape' must be an array of integers, got number 4");
}

TEST(SafetensorsErrors, NegativeShape) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":[2,-3],"data_offsets":[0,4]})", 4)),
                   "shape[1] must be a non-negative integer, got number -3");
}

TEST(SafetensorsErrors, FractionalShape) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})", 4)),
                   "shape[0] must be a non-negative integer, got number 1.5");
}

TEST(SafetensorsErrors, ShapeOverflow) {
  EXPECT_ERROR_HAS(
      parse(one_entry(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]})", 4)),
      "tensor 'w'", "overflows");
  // Fits in elements but not in bytes.
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4]})", 4)),
                   "overflows");
}

TEST(SafetensorsErrors, OffsetsNotTwoIntegers) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", 4)),
                   "'data_offsets' must be an array of two integers", "got array [0]");
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,"4"]})", 4)),
                   "data_offsets must be two non-negative integers");
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})", 4)),
                   "data_offsets must be two non-negative integers");
}

TEST(SafetensorsErrors, OffsetsDecreasing) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[4,0]})", 4)),
                   "data_offsets [4, 0] must be increasing");
}

TEST(SafetensorsErrors, ExtentDisagreesWithShape) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})", 20)), "tensor 'w'",
                   "span 20 bytes", "shape [2, 3] of F32", "needs 24");
}

TEST(SafetensorsErrors, DataPastEndOfFile) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", 12)), "tensor 'w'",
                   "runs past the end of the file", "holds only 12 bytes");
}

TEST(SafetensorsErrors, OverlappingTensors) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})";
  EXPECT_ERROR_HAS(parse(assemble(header, std::vector<uint8_t>(6))), "tensor 'b' (bytes [2, 6)) overlaps tensor 'a'");
}

TEST(SafetensorsErrors, HoleInDataBuffer) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})";
  EXPECT_ERROR_HAS(parse(assemble(header, std::vector<uint8_t>(6))), "tensor 'b' starts at byte 4",
                   "hole of 2 bytes");
}

TEST(SafetensorsErrors, TrailingUnindexedBytes) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"U8","shape":[2],"data_offsets":[0,2]})", 5)),
                   "holds 5 bytes but the tensors cover only 2", "3 trailing bytes");
}

TEST(SafetensorsErrors, DuplicateTensorNames) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_ERROR_HAS(parse(assemble(header, std::vector<uint8_t>(2))), "duplicate name 'a'");
}

TEST(SafetensorsErrors, DuplicateFieldInEntry) {
  EXPECT_ERROR_HAS(parse(one_entry(R"({"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]})", 1)),
                   "duplicate key 'dtype' inside 'w'");
}

TEST(SafetensorsErrors, MetadataMustHoldStrings) {
  EXPECT_ERROR_HAS(parse(assemble(R"({"__metadata__":{"n":3}})", {})),
                   "'__metadata__' value for 'n' must be a string, got number 3");
  EXPECT_ERROR_HAS(parse(assemble(R"({"__metadata__":[]})", {})), "'__metadata__' must be an object");
}

TEST(SafetensorsErrors, ToF32RejectsBadViews) {
  const std::vector<uint8_t> buf(8);
  SafetensorsTensor t{"c", "C64", 8, {1}, buf.data(), 8};
  EXPECT_ERROR_HAS(to_f32(t), "tensor 'c'", "cannot convert dtype 'C64'");
  SafetensorsTensor u{"u", "F32", 4, {3}, buf.data(), 8};
  EXPECT_ERROR_HAS(to_f32(u), "tensor 'u'", "n_bytes is 8", "needs 12");
}

// --- Models: single files, directories, sharded checkpoints ------------------

TEST(SafetensorsModelOpen, SingleFileAndDirectory) {
  TempDir dir;
  const std::vector<float> w = {1, 2};
  const std::string path = dir.write("model.safetensors", Builder().add("w", "F32", {2}, bytes_of(w)).build());
  for (const std::string& p : {path, dir.path().string()}) {
    const SafetensorsModel m = SafetensorsModel::open(p);
    EXPECT_EQ(m.files().size(), 1u);
    EXPECT_EQ(m.size(), 1u);
    EXPECT_EQ(to_f32(m.tensor("w")), w);
    EXPECT_EQ(m.find("x"), nullptr);
    EXPECT_ERROR_HAS(m.tensor("x"), "no tensor named 'x'", p);
  }
}

TEST(SafetensorsModelOpen, ShardedIndexLoadsAllShards) {
  TempDir dir;
  const std::vector<float> a = {1, 2, 3}, b = {4}, c = {5, 6};
  dir.write("model-00001-of-00002.safetensors",
            Builder().add("a", "F32", {3}, bytes_of(a)).add("b", "F32", {1}, bytes_of(b)).build());
  dir.write("model-00002-of-00002.safetensors", Builder().add("c", "F32", {2}, bytes_of(c)).build());
  dir.write("model.safetensors.index.json",
            std::string(R"({"metadata":{"total_size":24},"weight_map":{)"
                        R"("c":"model-00002-of-00002.safetensors",)"
                        R"("a":"model-00001-of-00002.safetensors",)"
                        R"("b":"model-00001-of-00002.safetensors"}})"));
  SafetensorsModel m = SafetensorsModel::open(dir.path().string());
  ASSERT_EQ(m.files().size(), 2u);
  // Shards come in the order the index first names them.
  EXPECT_NE(m.files()[0]->name().find("00002"), std::string::npos);
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(to_f32(m.tensor("a")), a);
  EXPECT_EQ(to_f32(m.tensor("b")), b);
  EXPECT_EQ(to_f32(m.tensor("c")), c);
  EXPECT_NE(m.file_of("c").name().find("00002"), std::string::npos);
  EXPECT_EQ(m.metadata().at("total_size"), "24");
  // The index file itself is accepted too, and the model survives a move.
  SafetensorsModel m2 = SafetensorsModel::open((dir.path() / "model.safetensors.index.json").string());
  SafetensorsModel moved = std::move(m2);
  EXPECT_EQ(to_f32(moved.tensor("a")), a);
}

TEST(SafetensorsModelOpen, MissingShard) {
  TempDir dir;
  dir.write("s1.safetensors", Builder().add("a", "U8", {1}, {1}).build());
  dir.write("model.safetensors.index.json",
            std::string(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})"));
  EXPECT_ERROR_HAS(SafetensorsModel::open(dir.path().string()), "model.safetensors.index.json",
                   "shard 's2.safetensors'", "'b'", "is missing");
}

TEST(SafetensorsModelOpen, TensorAbsentFromItsShard) {
  TempDir dir;
  dir.write("s1.safetensors", Builder().add("a", "U8", {1}, {1}).build());
  dir.write("model.safetensors.index.json",
            std::string(R"({"weight_map":{"a":"s1.safetensors","ghost":"s1.safetensors"}})"));
  EXPECT_ERROR_HAS(SafetensorsModel::open(dir.path().string()), "tensor 'ghost' in shard 's1.safetensors'",
                   "has no such tensor");
}

TEST(SafetensorsModelOpen, BadIndex) {
  TempDir dir;
  const std::string idx = (dir.path() / "model.safetensors.index.json").string();
  dir.write("model.safetensors.index.json", std::string(R"({"weight_map":{"a":"../evil.safetensors"}})"));
  EXPECT_ERROR_HAS(SafetensorsModel::open(idx), "leaves the index's directory");
  dir.write("model.safetensors.index.json", std::string(R"({"weight_map":{"a":"/etc/x.safetensors"}})"));
  EXPECT_ERROR_HAS(SafetensorsModel::open(idx), "absolute path");
  dir.write("model.safetensors.index.json", std::string(R"({"weight_map":{"a":1}})"));
  EXPECT_ERROR_HAS(SafetensorsModel::open(idx), "entry for tensor 'a' must be a shard file name", "got number 1");
  dir.write("model.safetensors.index.json", std::string(R"({"weight_map":[]})"));
  EXPECT_ERROR_HAS(SafetensorsModel::open(idx), "'weight_map' must be an object");
  dir.write("model.safetensors.index.json", std::string(R"({"metadata":{}})"));
  EXPECT_ERROR_HAS(SafetensorsModel::open(idx), "no 'weight_map'");
  dir.write("model.safetensors.index.json", std::string(R"({"weight_map":{"a":"x", "a":"y"}})"));
  EXPECT_ERROR_HAS(SafetensorsModel::open(idx), "duplicate key 'a' inside 'weight_map'");
  dir.write("model.safetensors.index.json", std::string(R"({"weight_map":)"));
  EXPECT_ERROR_HAS(SafetensorsModel::open(idx), "index (14 bytes) is malformed JSON");
}

TEST(SafetensorsModelOpen, DirectoryWithoutCheckpoint) {
  TempDir dir;
  EXPECT_ERROR_HAS(SafetensorsModel::open(dir.path().string()), "neither model.safetensors nor");
  dir.write("consolidated.safetensors", Builder().build());
  EXPECT_ERROR_HAS(SafetensorsModel::open(dir.path().string()), "found: consolidated.safetensors");
  EXPECT_ERROR_HAS(SafetensorsModel::open((dir.path() / "absent").string()), "no such file or directory");
}

TEST(SafetensorsModelOpen, ShardErrorsNameTheShard) {
  TempDir dir;
  dir.write("s1.safetensors", std::vector<uint8_t>{1, 2});
  dir.write("model.safetensors.index.json", std::string(R"({"weight_map":{"a":"s1.safetensors"}})"));
  EXPECT_ERROR_HAS(SafetensorsModel::open(dir.path().string()), "s1.safetensors", "shorter than the 8-byte");
}

}  // namespace
}  // namespace megakern
