// safetensors input that claims more than memory or than the file holds is
// refused before anything is allocated, and a device with no size cannot
// make the reader read forever (issue 7).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "posbias/safetensors.h"
#include "test_util.h"

namespace posbias {
namespace {

using test::expect_throw_with;

std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  std::uint64_t n = header.size();
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>((n >> (8 * b)) & 0xFF);
  return out + header + data;
}

TEST(Limits, SafetensorsHeadersClaimingHugeTensorsAreRefused) {
  // 1e6 x 1e6 float32 claimed by 16 bytes of data.
  const std::string huge = safetensors_bytes(
      R"({"w":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,4000000000000]}})",
      std::string(16, '\0'));
  expect_throw_with<std::invalid_argument>([&] { parse_safetensors(huge, "huge"); },
                                           "safetensors huge: ");
  // Extents whose product overflows.
  const std::string overflow = safetensors_bytes(
      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,0]}})",
      "");
  expect_throw_with<std::invalid_argument>([&] { parse_safetensors(overflow, "overflow"); },
                                           "safetensors overflow: ");
  // A header length past the 100,000,000-byte cap, and one past the file.
  std::string capped(8, '\0');
  capped[4] = 1;  // 2^32 bytes
  expect_throw_with<std::invalid_argument>([&] { parse_safetensors(capped + "{}", "cap"); },
                                           "exceeds the limit of 100000000");
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "posbias_limits_test.safetensors";
  {
    std::ofstream f(path, std::ios::binary);
    std::string claim(8, '\0');
    claim[0] = static_cast<char>(0xFF);
    claim[1] = static_cast<char>(0xE0);
    claim[2] = static_cast<char>(0xF5);
    claim[3] = 0x05;  // 99,999,999: under the cap, past the file
    f << claim << "{}";
  }
  expect_throw_with<std::invalid_argument>([&] { load_safetensors(path.string()); },
                                           "truncated: the header claims 99999999 bytes");
  std::filesystem::remove(path);
}

TEST(Limits, SafetensorsFromADeviceIsBounded) {
  // A character device or pipe has no size to check against: the reader
  // must still stop (it reads the 8-byte length, then only what the header
  // claims). /dev/zero claims a header of 0 bytes.
  if (!std::filesystem::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero";
  expect_throw_with<std::invalid_argument>([] { load_safetensors("/dev/zero"); },
                                           "header length 0");
}

}  // namespace
}  // namespace posbias
