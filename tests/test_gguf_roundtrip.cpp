// The GGUF writer read back by an outside reader: tests/fixtures/gguf_writer_roundtrip.gguf
// is what GGUFWriter writes for the tensors and metadata below (checked byte for
// byte, so the committed file cannot drift from the writer), and
// tests/fixtures/gguf_writer_roundtrip.json is what the `gguf` Python package
// (GGUFReader + gguf.dequantize) read from that file
// (scripts/fixtures/gen_gguf_roundtrip_fixture.py). Our reader must agree with it
// element for element, for every supported type that has a GGML type id.
//
// Regenerate after a deliberate change of the writer or of the tensor set:
//   MEGAKERN_WRITE_GGUF_FIXTURE=tests/fixtures/gguf_writer_roundtrip.gguf \
//     build/megakern_tests --gtest_filter='GGUFWriterRoundTrip.*'
//   python scripts/fixtures/gen_gguf_roundtrip_fixture.py   (with the gguf and numpy packages)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/gguf.h"
#include "test_util.h"

namespace megakern {
namespace {

// Ids of GGML's own types end below this; ours (FP8, NVFP4, ...) start here,
// and the gguf package does not know them.
constexpr uint32_t kFirstOwnId = 64;
constexpr int64_t kCols = 256, kRows = 2;  // one K-quant super-block per row

// Test values: exact in f32 (integers over 250, correctly rounded on every
// platform and in NumPy), magnitudes varying per 32-block, one all-zero block
// and one block with a single outlier.
std::vector<float> pattern(uint32_t type_id) {
  std::vector<float> x(static_cast<size_t>(kCols * kRows));
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t k = (static_cast<int64_t>(i) * 7919 + static_cast<int64_t>(type_id) * 104729) % 2001 - 1000;
    x[i] = static_cast<float>(k) / 250.f * static_cast<float>(1 + (i / 32) % 5);
  }
  for (size_t i = 64; i < 96; ++i) x[i] = 0.f;
  x[300] = 100.f;
  return x;
}

std::string tensor_name(DType t) { return std::string("t.") + dtype_traits(t).name; }

std::vector<DType> ggml_types() {
  size_t n = 0;
  const DType* all = all_dtypes(&n);
  std::vector<DType> out;
  for (size_t i = 0; i < n; ++i)
    if (static_cast<uint32_t>(all[i]) < kFirstOwnId) out.push_back(all[i]);
  return out;
}

std::vector<uint8_t> writer_file() {
  GGUFWriter w;
  w.set_string("general.architecture", "roundtrip");
  w.set_string("test.string", "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93");
  w.set_u32("test.u32", 4000000000u);
  w.set_i32("test.i32", -123456);
  w.set_u64("test.u64", (uint64_t{1} << 40) + 3);
  w.set_f32("test.f32", 0.1f);
  w.set_bool("test.bool", true);
  w.set_string_array("test.strings", {"a", "", "\xc3\xbcn\xc3\xaf"});
  w.set_i32_array("test.i32s", {-1, 0, 7});
  w.set_f32_array("test.f32s", {0.5f, -2.25f, 1e-3f});
  for (DType t : ggml_types()) {
    const auto x = pattern(static_cast<uint32_t>(t));
    w.add_tensor_f32(tensor_name(t), t, {kCols, kRows}, x.data());
  }
  // An odd-sized tensor, so the next one needs alignment padding.
  const std::vector<float> odd = {1.f, -2.f, 3.5f, 0.f, -0.f, 1e-20f, 65504.f};
  w.add_tensor_f32("t.odd", DType::F32, {7}, odd.data());
  w.add_tensor_f32("t.after_odd", DType::F16, {3}, odd.data());
  return w.serialize();
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(GGUFWriterRoundTrip, CommittedFileIsWhatTheWriterWrites) {
  const auto bytes = writer_file();
  if (const char* out = std::getenv("MEGAKERN_WRITE_GGUF_FIXTURE")) {
    std::ofstream f(out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good()) << "cannot write " << out;
  }
  const auto committed = read_bytes(fixture_path("gguf_writer_roundtrip.gguf"));
  ASSERT_FALSE(committed.empty()) << "missing fixture gguf_writer_roundtrip.gguf";
  ASSERT_EQ(committed.size(), bytes.size()) << "the writer's output changed; regenerate the fixture (see the top of "
                                               "this file)";
  EXPECT_EQ(0, std::memcmp(committed.data(), bytes.data(), bytes.size()));
}

TEST(GGUFWriterRoundTrip, GgufPackageAndOurReaderAgreeElementForElement) {
  const auto& fx = fixture_json("gguf_writer_roundtrip.json");
  const auto bytes = writer_file();
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "roundtrip.gguf");

  // Every supported GGML type is in the fixture.
  std::set<std::string> in_fixture;
  for (const auto& t : fx.at("tensors")) in_fixture.insert(t.at("name").get<std::string>());
  for (DType t : ggml_types())
    EXPECT_TRUE(in_fixture.count(tensor_name(t)))
        << dtype_traits(t).name << " is supported but not in the fixture: regenerate it (see the top of this file)";

  ASSERT_EQ(fx.at("tensors").size(), f->tensors().size());
  for (const auto& t : fx.at("tensors")) {
    const std::string name = t.at("name");
    SCOPED_TRACE(name);
    const GGUFTensorInfo& info = f->tensor(name);
    EXPECT_EQ(static_cast<uint32_t>(info.type), t.at("ggml_type").get<uint32_t>());
    EXPECT_EQ(info.shape, t.at("ne").get<std::vector<int64_t>>());
    EXPECT_EQ(static_cast<uint64_t>(info.data - bytes.data()), t.at("data_offset").get<uint64_t>())
        << "the gguf package found the data elsewhere";
    const auto want = t.at("values").get<std::vector<float>>();
    int64_t n = 1;
    for (int64_t d : info.shape) n *= d;
    ASSERT_EQ(static_cast<int64_t>(want.size()), n);
    std::vector<float> got(static_cast<size_t>(n));
    dtype_traits(info.type).dequantize(info.data, got.data(), n);
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t u = static_cast<size_t>(i);
      // Bit for bit (also the sign of zero), except that any NaN matches any NaN.
      const bool same = std::memcmp(&got[u], &want[u], sizeof(float)) == 0 || (std::isnan(got[u]) && std::isnan(want[u]));
      if (!same && mismatches++ < 5)
        ADD_FAILURE() << "element " << i << ": ours " << got[u] << ", gguf package " << want[u];
    }
    EXPECT_EQ(mismatches, 0);
  }

  // Metadata as the gguf package read it.
  const auto& kv = fx.at("metadata");
  EXPECT_EQ(kv.at("test.string").get<std::string>(), f->get_string("test.string"));
  EXPECT_EQ(kv.at("test.u32").get<int64_t>(), 4000000000);
  EXPECT_EQ(kv.at("test.i32").get<int64_t>(), -123456);
  EXPECT_EQ(kv.at("test.u64").get<uint64_t>(), (uint64_t{1} << 40) + 3);
  EXPECT_EQ(kv.at("test.f32").get<float>(), 0.1f);
  EXPECT_EQ(kv.at("test.bool").get<bool>(), true);
  EXPECT_EQ(kv.at("test.strings").get<std::vector<std::string>>(),
            (std::vector<std::string>{"a", "", "\xc3\xbcn\xc3\xaf"}));
  EXPECT_EQ(kv.at("test.i32s").get<std::vector<int64_t>>(), (std::vector<int64_t>{-1, 0, 7}));
  EXPECT_EQ(kv.at("test.f32s").get<std::vector<float>>(), (std::vector<float>{0.5f, -2.25f, 1e-3f}));
  EXPECT_EQ(kv.at("types").at("test.u32"), "UINT32");
  EXPECT_EQ(kv.at("types").at("test.i32"), "INT32");
  EXPECT_EQ(kv.at("types").at("test.u64"), "UINT64");
  EXPECT_EQ(kv.at("types").at("test.f32"), "FLOAT32");
  EXPECT_EQ(kv.at("types").at("test.bool"), "BOOL");
}

// The quantisation error the gguf package measured against the input values
// stays within each format's bound (documented in the fixture script).
TEST(GGUFWriterRoundTrip, QuantisationErrorWithinEachFormatsBound) {
  const auto& fx = fixture_json("gguf_writer_roundtrip.json");
  for (const auto& t : fx.at("tensors")) {
    if (!t.contains("max_err_over_block_amax")) continue;
    EXPECT_LE(t.at("max_err_over_block_amax").get<double>(), t.at("bound").get<double>()) << t.at("name");
  }
  // The values the script recomputed from the formula are the writer's input.
  for (DType t : ggml_types()) {
    const auto x = pattern(static_cast<uint32_t>(t));
    double sum = 0;
    for (float v : x) sum += v;
    for (const auto& e : fx.at("tensors"))
      if (e.at("name") == tensor_name(t)) EXPECT_NEAR(e.at("input_sum").get<double>(), sum, 1e-6 * (1 + std::fabs(sum)));
  }
}

// Our own formats (ids >= 64: FP8 e4m3, NVFP4, int4 group-128, int8 per
// column, ...) have no GGML id, so the gguf package cannot read them; the
// writer and our reader must still carry them intact: the bytes read back are
// the quantiser's bytes, and they decode to within the format's error.
TEST(GGUFWriterRoundTrip, OwnFormatsReadBackByOurReader) {
  size_t n = 0;
  const DType* all = all_dtypes(&n);
  GGUFWriter w;
  std::vector<DType> own;
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<uint32_t>(all[i]) < kFirstOwnId) continue;
    own.push_back(all[i]);
    const auto x = pattern(static_cast<uint32_t>(all[i]));
    w.add_tensor_f32(tensor_name(all[i]), all[i], {kCols, kRows}, x.data());
  }
  ASSERT_FALSE(own.empty());
  const auto bytes = w.serialize();
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "own.gguf");
  for (DType t : own) {
    SCOPED_TRACE(dtype_traits(t).name);
    const GGUFTensorInfo& info = f->tensor(tensor_name(t));
    EXPECT_EQ(info.type, t);
    EXPECT_EQ(info.shape, (std::vector<int64_t>{kCols, kRows}));
    const auto x = pattern(static_cast<uint32_t>(t));
    std::vector<uint8_t> q(row_bytes(t, kCols) * kRows);
    for (int64_t r = 0; r < kRows; ++r)
      dtype_traits(t).quantize(x.data() + r * kCols, q.data() + static_cast<size_t>(r) * row_bytes(t, kCols), kCols);
    ASSERT_EQ(info.n_bytes, q.size());
    EXPECT_EQ(0, std::memcmp(info.data, q.data(), q.size()));
    std::vector<float> y(x.size());
    dtype_traits(t).dequantize(info.data, y.data(), static_cast<int64_t>(y.size()));
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(y[i]) - x[i]));
    // The coarsest of these (4-bit) formats: within a quarter of the largest
    // input (100) after scaling, as for MXFP4 in the gguf-package fixture.
    EXPECT_LT(worst, 25.0);
  }
}

}  // namespace
}  // namespace megakern
