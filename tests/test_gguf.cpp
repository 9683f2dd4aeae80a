// GGUF reader and writer: round trips, and a clear error (never a crash) for
// every kind of malformed file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "io/gguf.h"
#include "model/dense.h"
#include "model/presets.h"
#include "test_util.h"

namespace megakern {
namespace {

std::vector<uint8_t> small_file() {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_i32("some.int", -7);
  w.set_u64("some.u64", 1ull << 40);
  w.set_f32("some.float", 0.5f);
  w.set_bool("some.bool", true);
  w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "<s>"});
  w.set_i32_array("ints", {1, -2, 3});
  w.set_f32_array("floats", {0.25f, -1.5f});
  std::vector<float> a(64), b(32 * 3);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.1f - 3.f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::sin(static_cast<float>(i));
  w.add_tensor_f32("a", DType::F32, {64}, a.data());
  w.add_tensor_f32("b", DType::Q8_0, {32, 3}, b.data());
  return w.serialize();
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    GGUFFile::parse(bytes.data(), bytes.size(), "test.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GGUF, RoundTripMetadataAndTensors) {
  const auto bytes = small_file();
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "test.gguf");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 2);
  EXPECT_EQ(f->get_int("some.int"), -7);
  EXPECT_EQ(f->get_int("some.u64"), int64_t{1} << 40);
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("some.float")), 0.5f);
  EXPECT_EQ(f->get_bool_opt("some.bool"), std::optional<bool>(true));
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "b", "<s>"}));
  EXPECT_EQ(f->get_int_array("ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f->get_float_array("floats"), (std::vector<double>{0.25, -1.5}));
  EXPECT_EQ(f->metadata_order().front(), "general.architecture");
  ASSERT_EQ(f->tensors().size(), 2u);
  const auto& a = f->tensor("a");
  EXPECT_EQ(a.type, DType::F32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(reinterpret_cast<const float*>(a.data)[10], 10 * 0.1f - 3.f);
  const auto& b = f->tensor("b");
  EXPECT_EQ(b.type, DType::Q8_0);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{32, 3}));
  EXPECT_EQ(b.n_bytes, 3 * 34u);
  EXPECT_EQ((b.data - bytes.data()) % 32, 0);
  EXPECT_EQ(f->find_tensor("missing"), nullptr);
  EXPECT_THROW(f->tensor("missing"), Error);
  EXPECT_THROW(f->get_string("llama.block_count"), Error);  // wrong type
  EXPECT_THROW(f->get_int("no.such.key"), Error);
  EXPECT_FALSE(f->get_int_opt("no.such.key").has_value());
}

TEST(GGUF, CustomAlignmentAndFileRoundTrip) {
  GGUFWriter w(64);
  std::vector<float> x(32, 1.f);
  w.add_tensor_f32("x", DType::F16, {32}, x.data());
  w.add_tensor_f32("y", DType::F32, {3}, x.data());
  const TempDir tmp;
  const std::string path = tmp.path + "/align.gguf";
  w.write(path);
  auto f = GGUFFile::open(path);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->tensor("y").offset % 64, 0u);
  std::filesystem::remove(path);
}

TEST(GGUF, BadMagicAndVersion) {
  auto bytes = small_file();
  bytes[0] = 'X';
  EXPECT_NE(parse_error(bytes).find("bad magic"), std::string::npos);
  bytes = small_file();
  bytes[4] = 1;  // version 1 (u32 counts) is not supported
  EXPECT_NE(parse_error(bytes).find("unsupported GGUF version 1"), std::string::npos);
  bytes[4] = 99;
  EXPECT_NE(parse_error(bytes).find("version 99"), std::string::npos);
  EXPECT_NE(parse_error({}).find("empty file"), std::string::npos);
}

// Every strict prefix of a valid file must be rejected cleanly.
TEST(GGUF, EveryTruncationIsAnError) {
  const auto bytes = small_file();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    // The last tensor may end before the padding does; cutting only padding is valid.
    const std::string err = parse_error(cut);
    if (err.empty()) {
      const auto f = GGUFFile::parse(cut.data(), cut.size(), "cut");
      const auto& last = f->tensors().back();
      EXPECT_LE(static_cast<size_t>(last.data + last.n_bytes - cut.data()), n) << "prefix " << n;
    }
  }
  std::vector<uint8_t> header(bytes.begin(), bytes.begin() + 30);
  EXPECT_NE(parse_error(header).find("truncated"), std::string::npos);
}

// Layout of a file with no metadata and one tensor named "t" of rank 1:
// magic 0, version 4, n_tensors 8, n_kv 16, name length 24, name 32,
// n_dims 33, dim0 37, type 45, offset 49.
std::vector<uint8_t> one_tensor_file() {
  GGUFWriter w;
  std::vector<float> x(32, 2.f);
  w.add_tensor_f32("t", DType::F32, {32}, x.data());
  return w.serialize();
}
template <typename T>
void poke(std::vector<uint8_t>& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

TEST(GGUF, UnknownAndUnsupportedTensorTypes) {
  auto b = one_tensor_file();
  poke<uint32_t>(b, 45, 77);
  EXPECT_NE(parse_error(b).find("type 77"), std::string::npos);
  poke<uint32_t>(b, 45, 10);  // q2_k: a real GGML type we do not compute with
  EXPECT_NE(parse_error(b).find("q2_k"), std::string::npos);
}

TEST(GGUF, MisalignedAndOutOfRangeTensors) {
  auto b = one_tensor_file();
  poke<uint64_t>(b, 49, 4);
  EXPECT_NE(parse_error(b).find("not a multiple of the alignment"), std::string::npos);
  poke<uint64_t>(b, 49, 1 << 20);
  EXPECT_NE(parse_error(b).find("outside the data section"), std::string::npos);
  poke<uint64_t>(b, 49, ~uint64_t{0} & ~uint64_t{31});  // would overflow offset + size
  EXPECT_NE(parse_error(b).find("outside the data section"), std::string::npos);
}

TEST(GGUF, AbsurdCountsAndShapes) {
  auto b = one_tensor_file();
  poke<uint64_t>(b, 8, uint64_t{1} << 60);
  EXPECT_NE(parse_error(b).find("absurd tensor count"), std::string::npos);
  b = one_tensor_file();
  poke<uint64_t>(b, 16, uint64_t{1} << 60);
  EXPECT_NE(parse_error(b).find("absurd metadata count"), std::string::npos);
  b = one_tensor_file();
  poke<uint64_t>(b, 24, uint64_t{1} << 62);  // name length
  EXPECT_NE(parse_error(b).find("absurd length"), std::string::npos);
  b = one_tensor_file();
  poke<uint32_t>(b, 33, 9);  // rank 9
  EXPECT_NE(parse_error(b).find("9 dimensions"), std::string::npos);
  b = one_tensor_file();
  poke<uint64_t>(b, 37, 0);
  EXPECT_NE(parse_error(b).find("absurd extent 0"), std::string::npos);
  b = one_tensor_file();
  poke<uint64_t>(b, 37, 33);  // 33 f32 values need more bytes than stored
  EXPECT_NE(parse_error(b).find("outside the data section"), std::string::npos);
}

TEST(GGUF, BlockSizeMismatch) {
  auto b = one_tensor_file();
  poke<uint32_t>(b, 45, static_cast<uint32_t>(DType::Q4_0));
  poke<uint64_t>(b, 37, 48);  // 48 is not a multiple of 32
  EXPECT_NE(parse_error(b).find("not a multiple of the q4_0 block size"), std::string::npos);
}

TEST(GGUF, BadMetadataValues) {
  GGUFWriter w;
  w.set_bool("flag", true);
  auto b = w.serialize();
  // The bool's byte is the last byte of the header: key "flag" at 24..35, type 36, value 40.
  b[40] = 7;
  EXPECT_NE(parse_error(b).find("bool value must be 0 or 1"), std::string::npos);
  b[40] = 1;
  poke<uint32_t>(b, 36, 13);
  EXPECT_NE(parse_error(b).find("unknown value type 13"), std::string::npos);

  GGUFWriter w2;
  w2.set_i32_array("arr", {1, 2, 3});
  b = w2.serialize();
  // key "arr" at 24..34, type 35, elem type 39, length 43.
  poke<uint64_t>(b, 43, uint64_t{1} << 50);
  EXPECT_NE(parse_error(b).find("exceeds"), std::string::npos);
  poke<uint64_t>(b, 43, 3);
  poke<uint32_t>(b, 39, static_cast<uint32_t>(GGUFValueType::ARRAY));
  EXPECT_NE(parse_error(b).find("nested arrays"), std::string::npos);
}

TEST(GGUF, DuplicatesAndBadAlignment) {
  GGUFWriter w;
  w.set_u32("general.alignment", 3);
  EXPECT_NE(parse_error(w.serialize()).find("power of two"), std::string::npos);
  std::vector<float> x(4, 0.f);
  GGUFWriter w2;
  w2.add_tensor_f32("t", DType::F32, {4}, x.data());
  EXPECT_THROW(w2.add_tensor_f32("t", DType::F32, {4}, x.data()), Error);
  EXPECT_THROW(w2.add_tensor("u", DType::F32, {4}, x.data(), 12), Error);
}

// Random byte flips in the header region must give an error or a valid file,
// never undefined behaviour (the sanitizer build checks the latter).
TEST(GGUF, RandomCorruptionNeverCrashes) {
  const auto good = small_file();
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % 400] ^= static_cast<uint8_t>(1u << (rng() % 8));
    try {
      auto f = GGUFFile::parse(b.data(), b.size(), "fuzz");
      for (const auto& t : f->tensors()) {
        ASSERT_GE(t.data, b.data());
        ASSERT_LE(t.data + t.n_bytes, b.data() + b.size());
      }
    } catch (const Error&) {
    }
  }
}

TEST(GGUF, OpensRealModelIfPresent) {
  const std::string path = test_model_path("smollm2-135m");
  if (path.empty()) GTEST_SKIP() << "models/smollm2-135m.gguf not fetched (run scripts/setup.sh)";
  auto f = GGUFFile::open(path);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->tensors().size(), 272u);
  EXPECT_EQ(f->tensor("token_embd.weight").type, DType::Q8_0);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 49152u);
}

// ---- Corrupt models: tensor infos that do not match the data ----------------------

// Where a tensor's info starts in a serialized file: the position just after
// its name. Layout: u32 n_dims, n_dims x u64 extent, u32 type, u64 offset.
size_t tensor_info_pos(const std::vector<uint8_t>& bytes, const std::string& name) {
  const uint64_t len = name.size();
  std::string needle(reinterpret_cast<const char*>(&len), sizeof len);
  needle += name;
  const auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  EXPECT_NE(it, bytes.end()) << name;
  return static_cast<size_t>(it - bytes.begin()) + needle.size();
}
template <typename T>
T peek(const std::vector<uint8_t>& b, size_t pos) {
  T v;
  std::memcpy(&v, b.data() + pos, sizeof v);
  return v;
}

// The error loading a dense model from this image gives, or "".
std::string model_load_error(const std::vector<uint8_t>& bytes) {
  try {
    auto f = GGUFFile::parse(bytes.data(), bytes.size(), "corrupt.gguf");
    DenseModel::load(*f);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GGUF, EmbeddingAndOutputWithWrongTypeShapeOrOffsetAreRefusedByName) {
  const std::vector<uint8_t> good = make_dense_gguf(*find_dense_preset("dense-mini"));
  ASSERT_EQ(model_load_error(good), "");
  for (const char* name : {"token_embd.weight", "output.weight"}) {
    const size_t pos = tensor_info_pos(good, name);
    ASSERT_EQ(peek<uint32_t>(good, pos), 2u);
    const size_t type_pos = pos + 4 + 16, offset_pos = type_pos + 4;
    const uint32_t type = peek<uint32_t>(good, type_pos);
    // A smaller type (Q4_0, or Q8_0 for output) and a larger one (F32).
    for (uint32_t other : {type == 2u ? 8u : 2u, 0u}) {
      auto b = good;
      poke<uint32_t>(b, type_pos, other);
      const std::string e = model_load_error(b);
      EXPECT_NE(e.find(name), std::string::npos) << name << " type " << other << ": " << e;
    }
    {  // one row only
      auto b = good;
      poke<uint64_t>(b, pos + 4 + 8, 1);
      const std::string e = model_load_error(b);
      EXPECT_NE(e.find(name), std::string::npos) << name << " one row: " << e;
    }
    {  // the offset of another tensor, and one past the end
      auto b = good;
      const uint64_t other_offset = peek<uint64_t>(good, tensor_info_pos(good, "blk.0.attn_q.weight") + 4 + 16 + 4);
      poke<uint64_t>(b, offset_pos, other_offset);
      std::string e = model_load_error(b);
      EXPECT_NE(e.find(name), std::string::npos) << name << " offset: " << e;
      poke<uint64_t>(b, offset_pos, uint64_t{1} << 40);
      e = model_load_error(b);
      EXPECT_NE(e.find(name), std::string::npos) << name << " offset past the end: " << e;
    }
  }
}

TEST(GGUF, ControlBytesInKeysAndNamesAreEscapedInErrors) {
  GGUFWriter w;
  const std::string key("bad\x01key\0tail", 12);
  w.set_u32(key, 1);
  auto bytes = w.serialize();
  // The first key's type field (after the 24-byte header and the key) made unknown.
  poke<uint32_t>(bytes, 24 + 8 + key.size(), 99);
  const std::string e = parse_error(bytes);
  EXPECT_NE(e.find("bad\\x01key\\x00tail"), std::string::npos) << e;
  EXPECT_EQ(e.find('\0'), std::string::npos);
  EXPECT_EQ(e.find('\x01'), std::string::npos);
}

TEST(GGUF, InspectReportsTheFormatItDetected) {
  const TempDir tmp;
  const std::string path = tmp.path + "/bad-magic.gguf";
  {
    auto bytes = small_file();
    bytes[0] = 'X';
    bytes[1] = '\0';
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  const CliResult r = run_cli("inspect " + path);
  std::filesystem::remove(path);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("not a model file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("GGUF magic"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("58005546"), std::string::npos) << r.err;  // the bytes it found
}

TEST(GGUF, MissingFileIsAClearError) {
  try {
    GGUFFile::open("/nonexistent/model.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
  }
}

}  // namespace
}  // namespace megakern
