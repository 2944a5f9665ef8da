// safetensors: round trips, the exact bytes the writer produces, the file
// PyTorch wrote for the golden vectors, and a table of malformed inputs, each
// of which must throw the right exception with a message that says what is
// wrong. A small fuzz loop flips bytes of a valid file: every variant must
// parse or throw std::invalid_argument, never crash or throw anything else.
#include "posbias/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.h"

namespace posbias {
namespace {

namespace fs = std::filesystem;

std::string golden_dir() {
  for (const char* dir : {POSBIAS_GOLDEN_COPY_DIR, POSBIAS_GOLDEN_SHARED_DIR}) {
    if (fs::exists(fs::path(dir) / "dpb_zeta_dim64_heads8.safetensors")) return dir;
  }
  return "";
}

// A fresh directory under the test temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "posbias_safetensors_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path_)) names.push_back(e.path().filename());
    return names;
  }

 private:
  std::string path_;
};

std::string u64_le(std::uint64_t v) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k) s[k] = static_cast<char>((v >> (8 * k)) & 0xFF);
  return s;
}

// A file from a header text (unpadded) and a data buffer.
std::string file_from(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

std::string f32_bytes(const std::vector<float>& values) {
  std::string s(values.size() * 4, '\0');
  std::memcpy(s.data(), values.data(), s.size());
  return s;
}

// The JSON header of serialized bytes.
nlohmann::json header_json(const std::string& bytes) {
  std::uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<unsigned char>(bytes[k]);
  return nlohmann::json::parse(bytes.substr(8, n));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Tensor filled(const std::vector<std::int64_t>& shape, DType dtype, float start) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  float* p = t.mutable_data<float>();
  for (std::int64_t k = 0; k < t.numel(); ++k) {
    p[k] = start + 0.37f * static_cast<float>(k) - 0.001f * static_cast<float>(k * k);
  }
  return t.to(dtype);
}

void expect_same_tensor(const Tensor& got, const Tensor& want, const std::string& name) {
  EXPECT_EQ(got.dtype(), want.dtype()) << name;
  EXPECT_EQ(got.shape(), want.shape()) << name;
  EXPECT_TRUE(got.is_contiguous()) << name;
  const std::vector<float> a = got.to_float_vector();
  const std::vector<float> b = want.to_float_vector();
  ASSERT_EQ(a.size(), b.size()) << name;
  for (std::size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(float_bits(a[k]), float_bits(b[k])) << name << " element " << k;
  }
}

// Every dtype, 0-d, empty tensors, and a strided view (stored contiguous).
TensorMap sample_tensors() {
  TensorMap m;
  m["f32"] = filled({2, 3}, DType::kFloat32, -1.5f);
  m["bf16"] = filled({4}, DType::kBFloat16, 0.25f);
  m["f16"] = filled({3, 1, 2}, DType::kFloat16, 7.0f);
  m["scalar"] = filled({}, DType::kFloat32, 42.0f);
  m["empty"] = Tensor::empty({0}, DType::kFloat32);
  m["empty_2d_f16"] = Tensor::empty({3, 0}, DType::kFloat16);
  m["view"] = filled({4, 5}, DType::kFloat32, 3.0f).slice(1, 1, 4);
  m["unicode \xc3\xa9 \"quoted\""] = filled({2}, DType::kBFloat16, -9.0f);
  return m;
}

TEST(Safetensors, RoundTripInMemoryEveryDtypeEmptyAndScalar) {
  const TensorMap in = sample_tensors();
  ASSERT_FALSE(in.at("view").is_contiguous());
  const std::string bytes = serialize_safetensors(in, {{"format", "pt"}, {"k", "v\n"}});
  const TensorMap out = parse_safetensors(bytes);
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(out.count(name)) << name;
    expect_same_tensor(out.at(name), t, name);
  }
  // The metadata is in the header, as strings.
  const auto header = header_json(bytes);
  EXPECT_EQ(header["__metadata__"], (nlohmann::json{{"format", "pt"}, {"k", "v\n"}}));
  EXPECT_EQ(header["view"]["shape"], (nlohmann::json{4, 3}));
}

TEST(Safetensors, RoundTripThroughAFile) {
  TempDir dir;
  const std::string path = dir.path() + "/weights.safetensors";
  const TensorMap in = sample_tensors();
  save_safetensors(path, in, {{"format", "pt"}});
  EXPECT_EQ(read_file(path), serialize_safetensors(in, {{"format", "pt"}}));
  const TensorMap out = load_safetensors(path);
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [name, t] : in) expect_same_tensor(out.at(name), t, name);
  // Only the file: no temporary left beside it.
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"weights.safetensors"});
}

TEST(Safetensors, EmptyMapIsAValidFile) {
  const std::string bytes = serialize_safetensors({});
  EXPECT_EQ(bytes, u64_le(8) + "{}      ");
  EXPECT_TRUE(parse_safetensors(bytes).empty());
}

// The exact layout: little-endian length, compact JSON with __metadata__
// first and the tensors in name order (keys dtype, shape, data_offsets),
// spaces up to a multiple of 8, then the data in header order.
TEST(Safetensors, HeaderLayoutIsByteExact) {
  TensorMap m;
  m["b"] = Tensor::from_vector({2}, {1.0f, -2.0f});
  m["a"] = Tensor::full({}, 1.0f, DType::kBFloat16);
  m["c"] = Tensor::full({1, 2}, -0.5f, DType::kFloat16);
  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"a\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,2]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[2,10]},"
      "\"c\":{\"dtype\":\"F16\",\"shape\":[1,2],\"data_offsets\":[10,14]}}";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(padded.size() % 8, 0u);
  const std::string data = std::string("\x80\x3f", 2) +          // bf16 1.0
                           std::string("\x00\x00\x80\x3f", 4) +  // f32 1.0
                           std::string("\x00\x00\x00\xc0", 4) +  // f32 -2.0
                           std::string("\x00\xb8\x00\xb8", 4);   // f16 -0.5 x2
  EXPECT_EQ(serialize_safetensors(m, {{"format", "pt"}}), u64_le(padded.size()) + padded + data);
  // Without metadata there is no __metadata__ key at all.
  const std::string bare = serialize_safetensors(m);
  EXPECT_EQ(bare.find("__metadata__"), std::string::npos);
  EXPECT_EQ(bare.substr(8, 6), "{\"a\":{");
}

// Little-endian F64 bytes of `values` (the host is little-endian in CI; the
// loader swaps on big-endian hosts, so build the bytes explicitly).
std::string f64_bytes(const std::vector<double>& values) {
  std::string data;
  for (const double v : values) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, 8);
    for (int b = 0; b < 8; ++b) data += static_cast<char>((bits >> (8 * b)) & 0xff);
  }
  return data;
}

TEST(Safetensors, Float64IsConvertedToFloat32RoundedOnce) {
  // FLT_MAX + 2^102 (below half an ulp past FLT_MAX) still rounds to FLT_MAX;
  // inf and NaN in the file stay inf and NaN.
  const double flt_max = std::numeric_limits<float>::max();
  const std::vector<double> values = {
      0.1, -1e-300, 1.0 + 1e-12, 3.0, flt_max, -(flt_max + 0x1p102), HUGE_VAL, std::nan("")};
  const TensorMap m = parse_safetensors(
      file_from(R"({"x":{"dtype":"F64","shape":[2,4],"data_offsets":[0,64]}})", f64_bytes(values)));
  const Tensor& x = m.at("x");
  EXPECT_EQ(x.dtype(), DType::kFloat32);
  EXPECT_EQ(x.shape(), (std::vector<std::int64_t>{2, 4}));
  const std::vector<float> got = x.to_float_vector();
  for (std::size_t k = 0; k < values.size(); ++k) {
    EXPECT_EQ(float_bits(got[k]), float_bits(static_cast<float>(values[k]))) << k;
  }
  EXPECT_EQ(got[5], -std::numeric_limits<float>::max());
}

// A finite F64 value beyond float32's range is reported at conversion, with
// the tensor, the element and the value (it used to become inf and was then
// reported by DynamicPositionBias as "mlp.4.bias: element [1] is not finite
// (inf)", though the file's value was finite). FLT_MAX + 2^103 is the tie
// that rounds to 2^128.
TEST(Safetensors, Float64BeyondFloat32RangeIsReportedAtConversion) {
  const std::string header = R"({"mlp.4.bias":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})";
  test::expect_throw_with<std::invalid_argument>(
      [&] {
        parse_safetensors(file_from(header, f64_bytes({0.5, 1e300})));
      },
      "tensor \"mlp.4.bias\": F64 element [1] = 1e+300 overflows float32");
  const double tie = static_cast<double>(std::numeric_limits<float>::max()) + 0x1p103;
  const std::string grid = R"({"w":{"dtype":"F64","shape":[2,3],"data_offsets":[0,48]}})";
  test::expect_throw_with<std::invalid_argument>(
      [&] {
        parse_safetensors(file_from(grid, f64_bytes({0, 0, 0, 0, 0, -tie})));
      },
      "tensor \"w\": F64 element [1, 2] = -3.4028235677973366e+38 overflows float32");
  // From a file too, named by its path.
  TempDir dir;
  const std::string path = dir.path() + "/big.safetensors";
  {
    std::ofstream f(path, std::ios::binary);
    f << file_from(header, f64_bytes({-1e39, 2.0}));
  }
  test::expect_throw_with<std::invalid_argument>([&] { load_safetensors(path); },
                                                 "F64 element [0] = -1e+39 overflows float32");
}

// The file PyTorch's safetensors wrote (tensors in state-dict order, not name
// order; __metadata__ last) loads with the right shapes and values.
TEST(Safetensors, LoadsTheFileWrittenByPyTorch) {
  const std::string dir = golden_dir();
  if (dir.empty()) GTEST_SKIP() << "golden directory not found";
  const TensorMap m = load_safetensors(dir + "/dpb_zeta_dim64_heads8.safetensors");
  struct Expect {
    const char* name;
    std::vector<std::int64_t> shape;
    float first, last;
  };
  const std::vector<Expect> expect = {
      {"mlp.0.weight", {64, 1}, 0.8014875650405884f, 0.04631471633911133f},
      {"mlp.0.bias", {64}, 0.8756434917449951f, -0.8365761041641235f},
      {"mlp.2.weight", {64, 64}, 0.08500975370407104f, -0.07972514629364014f},
      {"mlp.2.bias", {64}, -0.0430341511964798f, 0.08424445986747742f},
      {"mlp.4.weight", {8, 64}, -0.08594809472560883f, -0.07206778228282928f},
      {"mlp.4.bias", {8}, 0.04353216290473938f, -0.05610886216163635f},
  };
  ASSERT_EQ(m.size(), expect.size());
  for (const Expect& e : expect) {
    ASSERT_TRUE(m.count(e.name)) << e.name;
    const Tensor& t = m.at(e.name);
    EXPECT_EQ(t.dtype(), DType::kFloat32) << e.name;
    EXPECT_EQ(t.shape(), e.shape) << e.name;
    const std::vector<float> v = t.to_float_vector();
    EXPECT_EQ(v.front(), e.first) << e.name;
    EXPECT_EQ(v.back(), e.last) << e.name;
  }
  // And it parses identically from memory.
  const TensorMap again = parse_safetensors(read_file(dir + "/dpb_zeta_dim64_heads8.safetensors"));
  for (const auto& [name, t] : m) expect_same_tensor(again.at(name), t, name);
}

// Every proper prefix of a valid file is rejected (never read past the end).
TEST(Safetensors, EveryTruncationThrowsInvalidArgument) {
  TensorMap m;
  m["a"] = filled({3}, DType::kFloat32, 1.0f);
  m["b"] = filled({2, 2}, DType::kBFloat16, 2.0f);
  const std::string bytes = serialize_safetensors(m, {{"format", "pt"}});
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    try {
      parse_safetensors(bytes.substr(0, len), "prefix");
      ADD_FAILURE() << "prefix of " << len << " bytes parsed";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("safetensors prefix: ", 0), 0u) << msg;
      EXPECT_NE(msg.find("truncated"), std::string::npos) << len << ": " << msg;
    }
  }
  // And the same through the file reader, for a few cut points.
  TempDir dir;
  for (std::size_t len :
       {std::size_t{0}, std::size_t{5}, std::size_t{8}, std::size_t{40}, bytes.size() - 1}) {
    const std::string path = dir.path() + "/cut" + std::to_string(len);
    std::ofstream(path, std::ios::binary) << bytes.substr(0, len);
    EXPECT_THROW(load_safetensors(path), std::invalid_argument) << len;
  }
}

struct Malformed {
  const char* label;
  std::string bytes;
  std::vector<std::string> message_parts;
};

std::vector<Malformed> malformed_inputs() {
  const std::string four = f32_bytes({1.0f});
  const std::string eight = f32_bytes({1.0f, 2.0f});
  const std::string twelve = f32_bytes({1.0f, 2.0f, 3.0f});
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  std::vector<Malformed> v;
  v.push_back({"shorter than the length field", "abc", {"truncated", "3 bytes", "at least 8"}});
  v.push_back({"header length huge",
               u64_le(std::uint64_t{1} << 62) + "{}",
               {"header length 4611686018427387904", "exceeds the limit"}});
  v.push_back({"header length past the end",
               u64_le(1000) + "{}",
               {"truncated", "claims 1000 bytes", "only 2"}});
  v.push_back({"header length zero", u64_le(0), {"too short"}});
  v.push_back({"bad JSON", file_from(R"({"a":{"dtype":)", ""), {"not valid JSON"}});
  v.push_back({"comment in JSON", file_from(R"({/* x */})", ""), {"not valid JSON"}});
  v.push_back({"invalid UTF-8", file_from("{\"\xff\":1}", ""), {"not valid JSON"}});
  v.push_back({"header not an object", file_from("[1,2]", ""), {"must be a JSON object", "array"}});
  v.push_back({"non-object entry",
               file_from(R"({"a":5})", ""),
               {"tensor \"a\"", "expected an object", "integer 5"}});
  v.push_back({"missing data_offsets",
               file_from(R"({"a":{"dtype":"F32","shape":[1]}})", four),
               {"tensor \"a\"", "missing key \"data_offsets\""}});
  v.push_back({"missing dtype",
               file_from(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", four),
               {"tensor \"a\"", "missing key \"dtype\""}});
  v.push_back({"unexpected key",
               file_from(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", four),
               {"tensor \"a\"", "unexpected key \"x\""}});
  v.push_back({"duplicate tensor",
               file_from("{" + ok_a + "," + ok_a + "}", four),
               {"duplicate key \"a\""}});
  v.push_back(
      {"duplicate key in entry",
       file_from(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four),
       {"tensor \"a\"", "duplicate key \"dtype\""}});
  v.push_back({"unsupported dtype I64",
               file_from(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", eight),
               {"tensor \"a\"", "dtype \"I64\" is not supported", "F32, F16, BF16 or F64"}});
  v.push_back({"unsupported dtype U8",
               file_from(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", four),
               {"dtype \"U8\" is not supported"}});
  v.push_back({"unknown dtype",
               file_from(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", four),
               {"unknown dtype \"F33\""}});
  v.push_back({"dtype not a string",
               file_from(R"({"a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", four),
               {"dtype must be a string", "integer 32"}});
  v.push_back({"negative extent",
               file_from(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four),
               {"tensor \"a\"", "shape [-1]", ">= 0", "integer -1"}});
  v.push_back({"fractional extent",
               file_from(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", four),
               {"shape [1.5]", "number 1.5"}});
  v.push_back({"shape not an array",
               file_from(R"({"a":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", four),
               {"shape must be an array"}});
  v.push_back({"shape nested",
               file_from(R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", four),
               {"tensor \"a\"", "nested deeper"}});
  v.push_back({"deep nesting",
               file_from(std::string(5000, '[') + std::string(5000, ']'), ""),
               {"header", "nested deeper"}});
  v.push_back(
      {"element count overflows",
       file_from(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}})",
                 four),
       {"tensor \"a\"", "too many elements"}});
  v.push_back({"offsets mismatch shape",
               file_from(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four),
               {"tensor \"a\"", "hold 4 bytes", "F32 x [2] needs 8"}});
  v.push_back({"offsets mismatch 16-bit",
               file_from(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,4]}})", four),
               {"BF16 x [2, 2] needs 8"}});
  v.push_back({"offsets not a pair",
               file_from(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", four),
               {"data_offsets must be [begin, end]"}});
  v.push_back({"negative offset",
               file_from(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", four),
               {"data_offsets must be [begin, end]"}});
  v.push_back({"begin after end",
               file_from(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", four),
               {"begin > end"}});
  v.push_back({"out of range",
               file_from(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", four),
               {"tensor \"a\"", "out of range", "holds 4 bytes"}});
  v.push_back(
      {"overlapping",
       file_from(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           twelve),
       {"\"a\" [0, 8)", "\"b\" [4, 12)", "overlap"}});
  v.push_back(
      {"gap",
       file_from(
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
           twelve),
       {"gap", "[4, 8)", "\"b\""}});
  v.push_back({"gap at the start",
               file_from(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
               {"gap", "[0, 4)"}});
  v.push_back({"oversized",
               file_from("{" + ok_a + "}", four + "junk"),
               {"oversized", "cover 4 bytes", "holds 8", "4 trailing bytes"}});
  v.push_back({"metadata not an object",
               file_from(R"({"__metadata__":[1]})", ""),
               {"__metadata__ must be an object"}});
  v.push_back({"metadata value not a string",
               file_from(R"({"__metadata__":{"k":1}})", ""),
               {"__metadata__ entry \"k\"", "must be a string"}});
  return v;
}

TEST(Safetensors, MalformedInputsThrowWithPreciseMessages) {
  for (const Malformed& m : malformed_inputs()) {
    try {
      parse_safetensors(m.bytes, "test.safetensors");
      ADD_FAILURE() << m.label << ": parsed";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("safetensors test.safetensors: ", 0), 0u) << m.label << ": " << msg;
      for (const std::string& part : m.message_parts) {
        EXPECT_NE(msg.find(part), std::string::npos)
            << m.label << ": message lacks \"" << part << "\": " << msg;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << m.label << ": wrong exception type: " << e.what();
    }
  }
}

TEST(Safetensors, MalformedFilesNameThePath) {
  TempDir dir;
  const std::string path = dir.path() + "/bad.safetensors";
  std::ofstream(path, std::ios::binary)
      << file_from(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", f32_bytes({1, 2}));
  try {
    load_safetensors(path);
    FAIL() << "loaded";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"I64\""), std::string::npos) << msg;
  }
}

// A path comes from the caller (a golden file's case, a command line): the
// messages show it as quoted_name does, escaped and shortened, so a long or
// garbled path cannot make a long or garbled message (the golden fuzzer
// found a 4.7 KB one).
TEST(Safetensors, MessagesShowPathsBounded) {
  const std::string long_path = "/nonexistent/" + std::string(10000, 's') + ".safetensors";
  try {
    load_safetensors(long_path);
    FAIL() << "loaded";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_LT(msg.size(), 300u) << msg;
    EXPECT_NE(msg.find("cannot open safetensors file \"/nonexistent/sss"), std::string::npos)
        << msg;
    // (the system's error, ENAMETOOLONG here, follows)
    EXPECT_NE(msg.find("...\" (10025 bytes): "), std::string::npos) << msg;
  }
  try {
    load_safetensors("/nonexistent/a\nb.safetensors");
    FAIL() << "loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot open safetensors file \"/nonexistent/a\\nb.safetensors\": No such file or "
              "directory");
  }
}

TEST(Safetensors, ValidEdgeCasesParse) {
  // Zero-size tensors may share an offset; whitespace around the JSON (the
  // writer's padding) is fine; keys may come in any order.
  const TensorMap m = parse_safetensors(
      file_from(R"(  {"z":{"shape":[0,3],"dtype":"F16","data_offsets":[0,0]},)"
                R"("y":{"data_offsets":[0,0],"dtype":"F32","shape":[0]},)"
                R"("x":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"__metadata__":{}}    )",
                f32_bytes({2.5f})));
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m.at("z").shape(), (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(m.at("z").dtype(), DType::kFloat16);
  EXPECT_EQ(m.at("x").dim(), 0);
  EXPECT_EQ(m.at("x").at({}), 2.5f);
}

// Random byte changes of a valid file (mostly in the header, where they
// matter): each variant parses or throws std::invalid_argument.
TEST(Safetensors, RandomCorruptionNeverCrashes) {
  TensorMap m;
  m["alpha"] = filled({3, 2}, DType::kFloat32, 1.0f);
  m["beta"] = filled({5}, DType::kBFloat16, -3.0f);
  m["gamma"] = filled({}, DType::kFloat16, 0.5f);
  m["delta"] = Tensor::empty({0, 4}, DType::kFloat32);
  const std::string valid = serialize_safetensors(m, {{"format", "pt"}});
  std::mt19937_64 rng(12345);
  const char* interesting = "{}[]\",:0123456789-.eE \\";
  int parsed = 0;
  int rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string bytes = valid;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // 7 in 8 changes fall on the length field or the header.
      const std::size_t span =
          rng() % 8 ? std::min<std::size_t>(bytes.size(), 8 + 260) : bytes.size();
      const std::size_t at = rng() % span;
      switch (rng() % 3) {
        case 0:
          bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
          break;
        case 1:
          bytes[at] = interesting[rng() % std::strlen(interesting)];
          break;
        default:
          bytes[at] = static_cast<char>(rng() & 0xFF);
          break;
      }
    }
    if (rng() % 16 == 0) bytes.resize(rng() % (bytes.size() + 1));
    if (rng() % 16 == 0) bytes += std::string(rng() % 9, 'x');
    try {
      const TensorMap out = parse_safetensors(bytes, "fuzz");
      ++parsed;
      for (const auto& [name, t] : out) (void)t.to_float_vector();
    } catch (const std::invalid_argument&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": unexpected exception: " << e.what();
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(parsed, 10);  // e.g. flips inside the data or the padding
}

TEST(Safetensors, MissingFileIsRuntimeErrorWithReason) {
  const std::string path = "/nonexistent-posbias-dir/weights.safetensors";
  try {
    load_safetensors(path);
    FAIL() << "loaded";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  }
  TempDir dir;
  EXPECT_THROW(load_safetensors(dir.path()), std::runtime_error);  // a directory
}

TEST(Safetensors, FailedWritesThrowAndLeaveNoFile) {
  TempDir dir;
  const TensorMap m = sample_tensors();
  // Directory missing.
  const std::string missing = dir.path() + "/no/such/dir/w.safetensors";
  try {
    save_safetensors(missing, m);
    FAIL() << "saved";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(missing), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  }
  // Parent is a file.
  const std::string file = dir.path() + "/plain";
  std::ofstream(file) << "x";
  EXPECT_THROW(save_safetensors(file + "/w.safetensors", m), std::runtime_error);
  // Target is a directory: the data is written to the temporary file, the
  // rename fails, and the temporary is removed.
  const std::string subdir = dir.path() + "/target";
  fs::create_directory(subdir);
  try {
    save_safetensors(subdir, m);
    FAIL() << "saved";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("renaming"), std::string::npos) << e.what();
  }
  auto names = dir.entries();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"plain", "target"}));
  EXPECT_TRUE(fs::is_empty(subdir));
  // Unwritable directory (meaningless as root, who may write anywhere).
  if (::geteuid() != 0) {
    const std::string locked = dir.path() + "/locked";
    fs::create_directory(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_THROW(save_safetensors(locked + "/w.safetensors", m), std::runtime_error);
    fs::permissions(locked, fs::perms::owner_all);
    EXPECT_TRUE(fs::is_empty(locked));
  }
}

TEST(Safetensors, SaveReplacesAnExistingFileWhole) {
  TempDir dir;
  const std::string path = dir.path() + "/w.safetensors";
  std::ofstream(path) << std::string(100000, 'x');
  TensorMap m;
  m["a"] = filled({2}, DType::kFloat32, 1.0f);
  save_safetensors(path, m);
  EXPECT_EQ(read_file(path), serialize_safetensors(m));
  EXPECT_EQ(dir.entries().size(), 1u);
}

TEST(Safetensors, WriterRejectsWhatTheFormatCannotHold) {
  TensorMap reserved;
  reserved["__metadata__"] = Tensor::full({1}, 0.0f);
  EXPECT_THROW(serialize_safetensors(reserved), std::invalid_argument);
  TensorMap bad_name;
  bad_name["bad \xff name"] = Tensor::full({1}, 0.0f);
  EXPECT_THROW(serialize_safetensors(bad_name), std::invalid_argument);
  EXPECT_THROW(serialize_safetensors({}, {{"k", "\xc3"}}), std::invalid_argument);
  // Nothing is created for arguments the writer rejects.
  TempDir dir;
  EXPECT_THROW(save_safetensors(dir.path() + "/w.safetensors", reserved), std::invalid_argument);
  EXPECT_TRUE(dir.entries().empty());
}

// Issue 19: a tensor name from the file is shown quoted and escaped, and a
// megabyte-long one shortened with its length (one helper for every
// message: detail::quoted_name).
TEST(Safetensors, OddTensorNamesInMessagesAreQuotedEscapedAndShort) {
  for (const test::OddName& odd : test::odd_names()) {
    // A header is UTF-8 JSON: a name with a byte that is not UTF-8 cannot
    // be in one (the parser refuses it, MalformedInputsThrowWithPreciseMessages).
    if (odd.name.find('\xff') != std::string::npos) continue;
    const std::string key = nlohmann::json(odd.name).dump();  // the name, JSON-escaped
    const std::string bytes = file_from(
        "{" + key + R"(:{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", f32_bytes({1.0f}));
    std::string message;
    try {
      parse_safetensors(bytes);
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    test::expect_short_printable(message, "tensor " + odd.shown + ": unknown dtype \"Q7\"");
  }
}

}  // namespace
}  // namespace posbias
