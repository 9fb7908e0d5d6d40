// Checkpoint formats: safetensors, Hugging Face folders, trainer state, run checkpoints.
// Every test writes under build/test_checkpoint/<test name>/ and checks what it reads back
// against what it wrote, bit for bit where the format is lossless.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tetrad/checkpoint/safetensors.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"

namespace fs = std::filesystem;
using namespace tetrad;
using nlohmann::json;

namespace {

// A fresh folder for the current test.
std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path p = fs::path(TETRAD_BINARY_DIR) / "test_checkpoint" /
               (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

void flip_byte(const std::string& path, size_t from_end) {
  std::string b = read_bytes(path);
  ASSERT_GT(b.size(), from_end);
  b[b.size() - 1 - from_end] ^= 0x5A;
  write_bytes(path, b);
}

// A safetensors file from a header text and a data section, for malformed-file tests.
void write_raw_safetensors(const std::string& path, const std::string& header, size_t data_bytes) {
  std::string b(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  b += header;
  b.append(data_bytes, '\0');
  write_bytes(path, b);
}

// Runs f, which must throw tetrad::Error whose message contains every one of `parts`.
template <typename F>
std::string expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
    return msg;
  }
  ADD_FAILURE() << "expected tetrad::Error";
  return "";
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

// ------------------------------------------------------------------------------------------
// safetensors

TEST(Safetensors, F32RoundTripIsExact) {
  const std::string path = test_dir() + "/t.safetensors";
  const auto a = random_floats(15, 1), b = random_floats(7, 2);
  const float scalar = 3.25f;
  SafetensorsWriter w;
  w.add("a", {3, 5}, a.data());
  w.add("b", {7}, b.data());
  w.add("scalar", {}, &scalar);
  w.add("empty", {0, 4}, nullptr);
  w.set_metadata("format", "pt");
  w.set_metadata("note", "hello");
  w.write(path);

  // Header length plus 8 is a multiple of 8; no temporary file is left behind.
  const std::string bytes = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + (15 + 7 + 1) * 4);
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    EXPECT_EQ(e.path().filename(), "t.safetensors");

  SafetensorsReader r(path);
  EXPECT_EQ(r.tensors().size(), 4u);
  EXPECT_EQ(r.metadata().at("note"), "hello");
  EXPECT_EQ(r.at("a").shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(r.at("a").dtype, "F32");
  EXPECT_TRUE(same_bits(r.read_float("a"), a));
  EXPECT_TRUE(same_bits(r.read_float("b"), b));
  EXPECT_EQ(r.read_float("scalar"), std::vector<float>{3.25f});
  EXPECT_EQ(r.at("empty").numel, 0);
  EXPECT_EQ(r.find("nope"), nullptr);
  expect_error([&] { r.at("nope"); }, {path, "'nope'"});
}

TEST(Safetensors, TransposeOnWriteAndRead) {
  const std::string path = test_dir() + "/t.safetensors";
  // mem holds [2, 3] = the transpose of the file tensor [3, 2].
  const std::vector<float> mem = {0, 1, 2, 10, 11, 12};
  SafetensorsWriter w;
  w.add("w", {3, 2}, mem.data(), StoreDtype::F32, /*transpose=*/true);
  w.write(path);
  SafetensorsReader r(path);
  EXPECT_EQ(r.read_float("w"), (std::vector<float>{0, 10, 1, 11, 2, 12}));
  std::vector<float> back(6);
  r.read_float("w", back.data(), /*transpose=*/true);
  EXPECT_EQ(back, mem);
}

TEST(Safetensors, HalfPrecisionWithinRounding) {
  const std::string path = test_dir() + "/t.safetensors";
  auto v = random_floats(4096, 3);
  v[0] = 0.0f;
  v[1] = -1e-7f;  // subnormal in F16
  v[2] = 1e30f;   // inf in F16, finite in BF16
  SafetensorsWriter w;
  w.add("bf", {64, 64}, v.data(), StoreDtype::BF16);
  w.add("h", {4096}, v.data(), StoreDtype::F16);
  w.add("f", {4096}, v.data(), StoreDtype::F32);
  w.write(path);
  SafetensorsReader r(path);
  EXPECT_EQ(r.at("bf").dtype, "BF16");
  EXPECT_EQ(r.at("h").dtype, "F16");
  // The F32 tensor comes first in the data (decreasing element size keeps alignment).
  EXPECT_EQ(r.at("f").begin, 0u);
  const auto bf = r.read_float("bf"), h = r.read_float("h");
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_LE(std::fabs(bf[i] - v[i]), std::fabs(v[i]) * 0x1p-8f) << i;
    if (i == 2) {
      EXPECT_TRUE(std::isinf(h[i]));
    } else if (std::fabs(v[i]) >= 0x1p-14f) {
      EXPECT_LE(std::fabs(h[i] - v[i]), std::fabs(v[i]) * 0x1p-11f) << i;
    } else {
      EXPECT_LE(std::fabs(h[i] - v[i]), 0x1p-25f) << i;
    }
  }
}

TEST(Safetensors, ScalarConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);        // tie -> even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);    // tie -> even (up)
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(float_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_f16(0x1p-25f), 0x0000);               // tie -> even (zero)
  EXPECT_EQ(float_to_f16(1.5f * 0x1p-25f), 0x0001);
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f), 0x3C00);        // tie -> even
  EXPECT_EQ(float_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::nanf("")))));
  // Every 16-bit pattern converts to float and back unchanged (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f16 = f16_to_float(uint16_t(h)), b16 = bf16_to_float(uint16_t(h));
    if (std::isnan(f16)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f16))));
    } else {
      EXPECT_EQ(float_to_f16(f16), h) << h;
    }
    if (std::isnan(b16)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(b16))));
    } else {
      EXPECT_EQ(float_to_bf16(b16), h) << h;
    }
  }
}

TEST(Safetensors, TruncatedFileRefused) {
  const std::string path = test_dir() + "/t.safetensors";
  const auto a = random_floats(100, 4);
  SafetensorsWriter w;
  w.add("a", {10, 10}, a.data());
  w.write(path);
  std::string b = read_bytes(path);
  write_bytes(path, b.substr(0, b.size() - 10));
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "truncated"});
  write_bytes(path, b.substr(0, 40));  // inside the header
  expect_error([&] { SafetensorsReader r(path); }, {path, "truncated"});
  write_bytes(path, b.substr(0, 5));
  expect_error([&] { SafetensorsReader r(path); }, {path, "5 bytes"});
  expect_error([&] { SafetensorsReader r(path + ".missing"); }, {path + ".missing"});
}

TEST(Safetensors, BadHeaderRefused) {
  const std::string dir = test_dir(), path = dir + "/bad.safetensors";
  write_raw_safetensors(path, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], ", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "not valid JSON"});
  write_raw_safetensors(path, "[1, 2]  ", 0);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'{'"});
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [2]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "data_offsets"});
  write_raw_safetensors(path, R"({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "unknown dtype 'Q4'"});
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "need 12"});
  write_raw_safetensors(path, R"({"__metadata__": {"x": 1}})", 0);
  expect_error([&] { SafetensorsReader r(path); }, {path, "__metadata__", "'x'"});
  // A header length far beyond the file.
  std::string b(8, '\0');
  b[6] = 1;
  write_bytes(path, b + "{}");
  expect_error([&] { SafetensorsReader r(path); }, {path, "header length"});
}

TEST(Safetensors, OffsetsOutOfRangeOverlappingOrGappedRefused) {
  const std::string path = test_dir() + "/bad.safetensors";
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "[8, 16]", "past the end"});
  write_raw_safetensors(path,
                        R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                        R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                        12);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "'b'", "overlap"});
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "[0, 4)"});
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "trailing"});
}

TEST(Safetensors, OtherDtypesListedButNotReadAsFloat) {
  const std::string path = test_dir() + "/i.safetensors";
  write_raw_safetensors(path, R"({"ids": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}})", 16);
  SafetensorsReader r(path);
  EXPECT_EQ(r.at("ids").dtype, "I64");
  std::vector<float> out(2);
  expect_error([&] { r.read_float("ids", out.data()); }, {path, "'ids'", "I64", "F32, BF16 and F16"});
}

