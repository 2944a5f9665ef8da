// Hostile input to the tool as a process (issue 19), one test per bug: JSON
// nested 100,000 levels deep in a golden file, a golden "file" that never
// ends (/dev/zero) or is past the size limit, an attention distance table
// built before the memory of the run was checked, integers read as octal,
// and names and paths echoed raw. Each ends in exit code 2 and one error
// line naming the file and the limit, or in the right numbers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_process.h"
#include "posbias/dtype.h"
#include "posbias/safetensors.h"
#include "posbias/tensor.h"

namespace posbias::cli {
namespace {

constexpr std::size_t kDeep = 100000;

std::string nested_arrays(std::size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

std::string nested_objects(std::size_t depth) {
  std::string text;
  for (std::size_t k = 0; k < depth; ++k) text += "{\"a\":";
  return text + "1" + std::string(depth, '}');
}

void write(const TempFile& file, const std::string& text) {
  std::ofstream(file.path(), std::ios::binary) << text;
}

// `check-golden path` exits 2, prints nothing on stdout and one line on
// stderr naming the path and containing `part`.
void expect_golden_file_error(const std::string& path, const std::string& part) {
  const ProcessResult run = run_posbias({"check-golden", path});
  EXPECT_EQ(run.exit_code, 2) << describe({"check-golden", path}, run);
  EXPECT_EQ(run.out, "");
  const std::vector<std::string> lines = lines_of(run.err);
  ASSERT_EQ(lines.size(), 1u) << run.err.substr(0, 400);
  EXPECT_EQ(lines[0].rfind("posbias: error: \"" + path + "\": ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(part), std::string::npos) << lines[0];
  EXPECT_LT(lines[0].size(), 300u) << lines[0].substr(0, 400);
}

// ------------------------------------------------------- 1. deep nesting

TEST(CliHostileInput, GoldenNestedDeepAnywhereIsRefusedWithTheLimit) {
  const std::string limit = "limit of 64 levels";
  const std::vector<std::string> documents = {
      nested_arrays(kDeep),
      nested_objects(kDeep),
      "{\"cases\": " + nested_arrays(kDeep) + "}",
      "{\"cases\": [{\"kind\": " + nested_arrays(kDeep) + "}]}",
      "{\"cases\": [{\"kind\": \"alibi_slopes\", \"heads\": 8, \"slopes\": " +
          nested_objects(kDeep) + "}]}",
      // Unterminated: refused when the limit is passed, not at the end.
      std::string(kDeep, '['),
  };
  for (const std::string& text : documents) {
    TempFile file;
    write(file, text);
    expect_golden_file_error(file.path(), limit);
  }
}

TEST(CliHostileInput, GoldenValueJustWithinTheDepthLimitIsAFailedCaseWithAShortMessage) {
  // 64 levels in all: the file, "cases", the case, then 61 levels of slopes.
  TempFile file;
  write(file, "{\"cases\": [{\"kind\": \"alibi_slopes\", \"heads\": 8, \"slopes\": " +
                  nested_arrays(61) + "}]}");
  const ProcessResult run = run_posbias({"check-golden", file.path()});
  EXPECT_EQ(run.exit_code, 1) << describe({"check-golden", file.path()}, run);
  const std::vector<std::string> lines = lines_of(run.out);
  ASSERT_EQ(lines.size(), 2u) << run.out;
  EXPECT_EQ(lines[0],
            "FAIL case 0 (alibi_slopes): malformed case: field 'slopes'[0] must be a number, got "
            "array " +
                std::string(37, '[') + "...");
  EXPECT_EQ(lines[1], "0 passed, 1 failed, 0 skipped");
}

// --------------------------------------------------------- 2. endless input

TEST(CliHostileInput, GoldenFromADeviceThatNeverEndsIsRefusedWithTheLimit) {
  for (const std::string device : {"/dev/zero", "/dev/urandom"}) {
    expect_golden_file_error(device, "larger than the golden-file limit of 67108864 bytes");
  }
}

TEST(CliHostileInput, GoldenFilePastTheSizeLimitIsRefusedBeforeItIsRead) {
  TempFile file;
  // Sparse: 64 MiB + 1 byte of zeros on disk costs nothing.
  ASSERT_EQ(ftruncate(file.fd(), (off_t{64} << 20) + 1), 0);
  expect_golden_file_error(file.path(), "larger than the golden-file limit of 67108864 bytes");
}

// ------------------------------------- 4. the table counted before it is built

TEST(CliHostileInput, AttentionTableCountedWithTheRunBeforeItIsBuilt) {
  for (const std::string from : {"dpb", "t5"}) {
    // k and v (8 TB) were refused only after an 8 GB table had been built.
    expect_bad_argument({"attention", "--heads", "1", "-i", "1", "-j", "1000000000", "-d", "1000",
                         "--bias", "table", "--table-from", from},
                        "attention with q [1, 1, 1, 1000], k and v [1, 1, 1000000000, 1000], "
                        "distance table [1, 1999999999] (float32) needs about 8.008e+12 bytes");
    // Small q, k and v: the table alone (131 GB) is past memory.
    expect_bad_argument({"attention", "--heads", "4096", "--kv-heads", "1", "-i", "1", "-j",
                         "4000000", "-d", "1", "--bias", "table", "--table-from", from},
                        "distance table [4096, 7999999] (float32) needs about 1.311e+11 bytes");
  }
  // From --inputs: the table is sized by the file's lengths, checked first.
  TempFile small;
  save_safetensors(small.path(), {{"q", Tensor::full({1, 65536, 1, 1}, 0.0f, DType::kFloat32)},
                                  {"k", Tensor::full({1, 1, 200000, 1}, 0.0f, DType::kFloat32)},
                                  {"v", Tensor::full({1, 1, 200000, 1}, 0.0f, DType::kFloat32)}});
  expect_bad_argument({"attention", "--inputs", small.path(), "--bias", "table"},
                      "distance table [65536, 399999] (float32) needs about 1.049e+11 bytes");
  TempFile no_d;
  save_safetensors(no_d.path(),
                   {{"q", Tensor::full({1, 1, 1, 0}, 0.0f, DType::kFloat32)},
                    {"k", Tensor::full({1, 1, 1000000000, 0}, 0.0f, DType::kFloat32)},
                    {"v", Tensor::full({1, 1, 1000000000, 0}, 0.0f, DType::kFloat32)}});
  expect_bad_argument({"attention", "--inputs", no_d.path(), "--bias", "table"},
                      "attention_forward: d must be >= 1, got 0");
  // A length whose 2j - 1 and byte count overflow int64.
  expect_bad_argument({"attention", "--heads", "2", "-i", "1", "-j", "9223372036854775807", "-d",
                       "1", "--bias", "table"},
                      "distance table [2, 18446744073709551613] (float32) needs more than "
                      "1.8e+19 bytes");
}

// ---------------------------------------------------- 6. integers: base 10

TEST(CliHostileInput, LeadingZerosAreDecimalEverywhere) {
  const auto same = [](const std::vector<std::string>& zeros,
                       const std::vector<std::string>& plain) {
    EXPECT_EQ(run_ok(zeros).out, run_ok(plain).out) << describe(zeros, run_posbias(zeros));
  };
  same({"slopes", "--heads", "010", "--format", "json"},
       {"slopes", "--heads", "10", "--format", "json"});
  same({"slopes", "--heads=010", "--format", "json"},
       {"slopes", "--heads", "10", "--format", "json"});
  same({"alibi", "--heads", "2", "-i", "1", "-j", "010", "--format", "json"},
       {"alibi", "--heads", "2", "-i", "1", "-j", "10", "--format", "json"});
  same({"slopes", "--heads", "+012", "--format", "json"},
       {"slopes", "--heads", "12", "--format", "json"});
  same({"t5-bucket", "--rel", "010,-010"}, {"t5-bucket", "--rel", "10,-10"});
  same({"slopes", "--heads", "16", "--range", "04:010", "--format", "json"},
       {"slopes", "--heads", "16", "--range", "4:10", "--format", "json"});
  same({"dpb", "--dim", "4", "--heads", "2", "-i", "2", "-j", "2", "--seed", "010", "--format",
        "json"},
       {"dpb", "--dim", "4", "--heads", "2", "-i", "2", "-j", "2", "--seed", "10", "--format",
        "json"});
  EXPECT_EQ(json_tensor(run_ok({"slopes", "--heads", "010", "--format", "json"}).out, {10}).size(),
            10u);
}

TEST(CliHostileInput, HexBinaryAndOctalPrefixesAreRefused) {
  const std::string why = "is not a base-10 integer (0x, 0b and 0o prefixes are not accepted)";
  expect_bad_argument({"slopes", "--heads", "0x10"}, "--heads: \"0x10\" " + why);
  expect_bad_argument({"slopes", "--heads", "0X10"}, "--heads: \"0X10\" " + why);
  expect_bad_argument({"slopes", "--heads", "0b11"}, "--heads: \"0b11\" " + why);
  expect_bad_argument({"slopes", "--heads", "0o17"}, "--heads: \"0o17\" " + why);
  expect_bad_argument({"alibi", "--heads", "2", "-i", "1", "-j", "-0x1"}, "-j: \"-0x1\" " + why);
  expect_bad_argument({"t5-bucket", "--rel", "1,0x2"},
                      "--rel: item 2 of \"1,0x2\" (\"0x2\") " + why);
  expect_bad_argument({"slopes", "--heads", "8", "--range", "0x1:4"},
                      "--range must be H0:H1 (two base-10 integers, heads [H0, H1)), got "
                      "\"0x1:4\"");
  expect_bad_argument({"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--seed", "0x5"},
                      "--seed must be an integer in [0, 18446744073709551615], got \"0x5\"");
  expect_bad_argument({"slopes", "--heads", "1e3"}, "--heads: \"1e3\" is not an integer");
}

// ------------------------------------------------ 5. names and values quoted

TEST(CliHostileInput, OddNamesAndValuesAreEscapedAndShort) {
  // A golden case kind with control bytes, a byte that is not UTF-8 and a
  // megabyte of text: one short skip line, escaped.
  TempFile golden;
  write(golden,
        "{\"cases\": [{\"kind\": \"a\\u0007b\\nc\\u001b[31m" + std::string(1 << 20, 'x') + "\"}]}");
  const ProcessResult run = run_posbias({"check-golden", golden.path()});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  const std::vector<std::string> lines = lines_of(run.out);
  ASSERT_EQ(lines.size(), 2u) << run.out.substr(0, 400);
  EXPECT_EQ(lines[0].rfind("skip case 0: unknown kind \"a\\u0007b\\nc\\u001b[31mxxx", 0), 0u)
      << lines[0].substr(0, 400);
  EXPECT_NE(lines[0].find("...\" (1048586 bytes)"), std::string::npos) << lines[0].substr(0, 400);
  EXPECT_LT(lines[0].size(), 200u);

  // A path with a newline and an escape sequence: one line, escaped.
  const std::string odd = "/nonexistent/a\nb\x1b[2J\xff.json";
  expect_bad_argument({"check-golden", odd},
                      "cannot read \"/nonexistent/a\\nb\\u001b[2J\\xff.json\": No such file");
  // An unknown command and a bad option value, 100,000 bytes long (about the
  // most one argument can hold: MAX_ARG_STRLEN is 128 KiB).
  expect_bad_argument({std::string(100000, 'z')}, "unknown command \"zzz");
  const ProcessResult long_value = run_posbias({"slopes", "--heads", std::string(100000, '9')});
  EXPECT_EQ(long_value.exit_code, 2);
  EXPECT_LT(long_value.err.size(), 400u) << long_value.err.substr(0, 400);
  EXPECT_NE(long_value.err.find("(100000 bytes) does not fit in a 64-bit integer"),
            std::string::npos)
      << long_value.err.substr(0, 400);
  // An argument CLI11 echoes as it is ("not expected"): escaped, cut.
  expect_bad_argument({"slopes", "--heads", "2", "\x1b[2Jextra\x7f"}, "\\u001b[2Jextra\\u007f");
  const ProcessResult long_extra =
      run_posbias({"slopes", "--heads", "2", std::string(100000, 'e')});
  EXPECT_EQ(long_extra.exit_code, 2);
  EXPECT_LT(long_extra.err.size(), 2100u);
  EXPECT_NE(long_extra.err.find("... ("), std::string::npos) << long_extra.err.substr(0, 200);
  // A JSON syntax error inside a string of control bytes: the excerpt
  // nlohmann quotes is escaped.
  TempFile bad;
  write(bad, std::string("{\"cases\": [\"\x01\x02"));
  expect_bad_argument({"check-golden", bad.path()}, "not valid JSON: ");
}

}  // namespace
}  // namespace posbias::cli
