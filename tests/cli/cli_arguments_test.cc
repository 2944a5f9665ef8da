// `posbias` as a process: --version, --help, and bad arguments of every
// command (exit code 2, nothing on stdout, one error line).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli_process.h"
#include "posbias/alibi.h"
#include "posbias/attention.h"
#include "posbias/dpb.h"
#include "posbias/safetensors.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"
#include "posbias/version.h"

namespace posbias::cli {
namespace {

using json = nlohmann::json;

// --------------------------------------------------------------- the basics

TEST(Cli, VersionPrintsTheLibraryVersion) {
  const ProcessResult run = run_ok({"--version"});
  EXPECT_EQ(run.out, std::string("posbias ") + version() + "\n");
}

TEST(Cli, HelpExitsZero) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--help"},
                                               {"-h"},
                                               {"slopes", "--help"},
                                               {"alibi", "--help"},
                                               {"alibi-bias", "--help"},
                                               {"dpb", "--help"},
                                               {"t5", "--help"},
                                               {"t5-bucket", "--help"},
                                               {"demo", "--help"},
                                               {"attention", "--help"},
                                               {"check-golden", "--help"},
                                               {"bench", "--help"}}) {
    const ProcessResult run = run_ok(args);
    EXPECT_NE(run.out.find("Usage: posbias"), std::string::npos) << describe(args, run);
  }
  const ProcessResult top = run_ok({"--help"});
  for (const char* command : {"demo", "slopes", "alibi", "alibi-bias", "dpb", "t5", "t5-bucket",
                              "attention", "check-golden", "bench"}) {
    EXPECT_NE(top.out.find(std::string("  ") + command + " "), std::string::npos)
        << "--help does not list " << command << "\n"
        << top.out;
  }
}

// ----------------------------------------------------------- bad arguments

struct BadArgs {
  std::string name;  // the test's name
  std::vector<std::string> args;
  std::string message_part;  // must appear in the error line
};

class BadArgument : public testing::TestWithParam<BadArgs> {};

TEST_P(BadArgument, ExitsTwoWithOneErrorLine) {
  const BadArgs& bad = GetParam();
  expect_bad_argument(bad.args, bad.message_part);
}

INSTANTIATE_TEST_SUITE_P(
    Cli, BadArgument,
    testing::Values(
        BadArgs{"NoCommand", {}, "no command given"},
        BadArgs{"UnknownCommand", {"frobnicate"}, "unknown command \"frobnicate\""},
        BadArgs{"UnknownTopLevelOption", {"--nope"}, "--nope"},
        BadArgs{"DemoTakesNoArguments", {"demo", "extra"}, "extra"},
        BadArgs{"SlopesWithoutHeads", {"slopes"}, "--heads is required"},
        BadArgs{"SlopesZeroHeads", {"slopes", "--heads", "0"}, "heads must be >= 1, got 0"},
        BadArgs{"SlopesHeadsNotANumber", {"slopes", "--heads", "abc"}, "abc"},
        BadArgs{"SlopesHeadsNotAnInteger", {"slopes", "--heads", "2.5"}, "2.5"},
        BadArgs{"SlopesHeadsWithoutValue", {"slopes", "--heads"}, "--heads"},
        BadArgs{"SlopesMaxBiasNan",
                {"slopes", "--heads", "8", "--max-bias", "nan"},
                "max_bias must be finite"},
        BadArgs{
            "SlopesMaxBiasOverflow", {"slopes", "--heads", "8", "--max-bias", "1e999"}, "max_bias"},
        BadArgs{"SlopesRangePastTheHeads", {"slopes", "--heads", "8", "--range", "4:9"}, "[4, 9)"},
        BadArgs{"SlopesRangeNotARange",
                {"slopes", "--heads", "8", "--range", "4"},
                "--range must be H0:H1"},
        BadArgs{"SlopesUnknownFormat", {"slopes", "--heads", "8", "--format", "xml"}, "xml"},
        BadArgs{"AlibiWithoutHeads", {"alibi", "-i", "1", "-j", "1"}, "--heads is required"},
        BadArgs{"AlibiWithoutJ", {"alibi", "--heads", "2", "-i", "1"}, "-j is required"},
        BadArgs{"AlibiZeroHeads",
                {"alibi", "--heads", "0", "-i", "1", "-j", "1"},
                "heads must be >= 1, got 0"},
        BadArgs{"AlibiTotalHeadsBelowHeads",
                {"alibi", "--heads", "4", "--total-heads", "2", "-i", "1", "-j", "1"},
                "total_heads = 2, heads = 4"},
        BadArgs{"AlibiNegativeI", {"alibi", "--heads", "4", "-i", "-1", "-j", "2"}, "i = -1"},
        BadArgs{"AlibiNegativeJ", {"alibi", "--heads", "4", "-i", "2", "-j", "-3"}, "j = -3"},
        BadArgs{"AlibiTooLarge",
                {"alibi", "--heads", "16", "-i", "100000000", "-j", "100000000"},
                "[16, 100000000, 100000000]"},
        BadArgs{"AlibiHeadsOverflowInt64",
                {"alibi", "--heads", "99999999999999999999", "-i", "1", "-j", "1"},
                "does not fit in a 64-bit integer"},
        BadArgs{"AlibiUnknownDtype",
                {"alibi", "--heads", "2", "-i", "1", "-j", "1", "--dtype", "float64"},
                "float64"},
        BadArgs{"AlibiTooFewSlopes",
                {"alibi", "--heads", "2", "-i", "1", "-j", "1", "--slopes", "0.5"},
                "got 1"},
        BadArgs{"AlibiInfiniteSlope",
                {"alibi", "--heads", "1", "-i", "1", "-j", "1", "--slopes", "inf"},
                "not finite"},
        BadArgs{"AlibiSlopeNotANumber",
                {"alibi", "--heads", "2", "-i", "1", "-j", "1", "--slopes", "0.5,x"},
                "--slopes"},
        BadArgs{"AlibiUnknownOption",
                {"alibi", "--heads", "2", "-i", "1", "-j", "1", "--bogus"},
                "--bogus"},
        BadArgs{"AlibiBiasZeroHeads",
                {"alibi-bias", "--heads", "0", "-i", "3", "-j", "3"},
                "n_heads must be >= 1"},
        BadArgs{"AlibiBiasTooFewSlopes",
                {"alibi-bias", "--heads", "2", "--slopes", "-0.2", "-i", "3", "-j", "3"},
                "got 1"},
        BadArgs{
            "AlibiBiasNegativeLength", {"alibi-bias", "--heads", "2", "-i", "-3", "-j", "3"}, "-3"},
        BadArgs{
            "DpbWithoutDim", {"dpb", "--heads", "2", "-i", "1", "-j", "1"}, "--dim is required"},
        BadArgs{"DpbZeroDim",
                {"dpb", "--dim", "0", "--heads", "2", "-i", "1", "-j", "1"},
                "dim must be >= 1, got 0"},
        BadArgs{"DpbZeroHeads",
                {"dpb", "--dim", "4", "--heads", "0", "-i", "1", "-j", "1"},
                "heads must be >= 1, got 0"},
        BadArgs{"DpbZeroDepth",
                {"dpb", "--dim", "4", "--heads", "2", "--variant", "x-transformers", "--depth", "0",
                 "-i", "1", "-j", "1"},
                "depth must be >= 1, got 0"},
        BadArgs{"DpbDepthOfZeta",
                {"dpb", "--dim", "4", "--heads", "2", "--depth", "3", "-i", "1", "-j", "1"},
                "--depth, --log-distance and --norm are options of --variant x-transformers"},
        BadArgs{"DpbNormOfZeta",
                {"dpb", "--dim", "4", "--heads", "2", "--norm", "-i", "1", "-j", "1"},
                "got --depth 2 --norm"},
        BadArgs{
            "DpbUnknownVariant",
            {"dpb", "--dim", "4", "--heads", "2", "--variant", "lucidrains", "-i", "1", "-j", "1"},
            "lucidrains"},
        BadArgs{"DpbIAboveJ",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "6", "-j", "5"},
                "need 0 <= i <= j (i and j are lengths), got i = 6, j = 5"},
        BadArgs{"DpbNegativeI",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "-1", "-j", "5"},
                "got i = -1, j = 5"},
        BadArgs{"DpbNegativeJ",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "0", "-j", "-2"},
                "got i = 0, j = -2"},
        BadArgs{"DpbWithoutLengths",
                {"dpb", "--dim", "4", "--heads", "2"},
                "-i is required (or --table with -j, or --save FILE)"},
        BadArgs{"DpbWithoutJ", {"dpb", "--dim", "4", "--heads", "2", "-i", "3"}, "-j is required"},
        BadArgs{"DpbTableWithI",
                {"dpb", "--dim", "4", "--heads", "2", "--table", "-i", "1", "-j", "3"},
                "-i is not used with --table"},
        BadArgs{"DpbTableZeroJ",
                {"dpb", "--dim", "4", "--heads", "2", "--table", "-j", "0"},
                "j must be >= 1, got 0"},
        BadArgs{"DpbTooLarge",
                {"dpb", "--dim", "4", "--heads", "16", "-i", "100000000", "-j", "100000000"},
                "[16, 100000000, 100000000]"},
        BadArgs{"DpbSeedAndWeights",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--seed", "1",
                 "--weights", "w.safetensors"},
                "--seed excludes --weights"},
        BadArgs{"DpbNegativeSeed",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--seed", "-1"},
                "--seed must be an integer in [0, 18446744073709551615], got \"-1\""},
        BadArgs{"DpbSeedOverflow",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--seed",
                 "18446744073709551616"},
                "got \"18446744073709551616\""},
        BadArgs{"DpbUnknownDtype",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--dtype", "int8"},
                "int8"},
        BadArgs{"T5WithoutHeads", {"t5", "-i", "1", "-j", "1"}, "--heads is required"},
        BadArgs{"T5ZeroHeads",
                {"t5", "--heads", "0", "-i", "1", "-j", "1"},
                "heads must be >= 1, got 0"},
        BadArgs{"T5NegativeI", {"t5", "--heads", "2", "-i", "-1", "-j", "1"}, "i = -1"},
        BadArgs{"T5BucketsNegativeJ",
                {"t5", "-i", "1", "-j", "-4", "--buckets"},
                "i and j must be >= 0, got i = 1, j = -4"},
        BadArgs{"T5TooFewBuckets",
                {"t5", "--heads", "2", "-i", "1", "-j", "1", "--num-buckets", "2"},
                "num_buckets"},
        BadArgs{"T5BucketsTooFewBuckets",
                {"t5", "-i", "1", "-j", "1", "--num-buckets", "2", "--buckets"},
                "num_buckets"},
        BadArgs{"T5MaxDistanceTooSmall",
                {"t5", "--heads", "2", "-i", "1", "-j", "1", "--max-distance", "8"},
                "max_distance"},
        BadArgs{
            "T5NanScale", {"t5", "--heads", "2", "-i", "1", "-j", "1", "--scale", "nan"}, "scale"},
        BadArgs{
            "T5TableZeroJ", {"t5", "--heads", "2", "-j", "0", "--table"}, "j must be >= 1, got 0"},
        BadArgs{"T5BucketsJsonPastMemory",
                {"t5", "-i", "100000000", "-j", "100000000", "--buckets", "--format", "json"},
                "--buckets --format json: the bucket grid [100000000, 100000000] (int64) needs "
                "80000000000000000 bytes, more than this machine's"},
        BadArgs{"T5BucketsJsonOverflow",
                {"t5", "-i", "4000000000", "-j", "4000000000", "--buckets", "--format", "json"},
                "the bucket grid [4000000000, 4000000000] (int64) is too large: its size in bytes "
                "overflows int64"},
        BadArgs{"T5TableWithI",
                {"t5", "--heads", "2", "--table", "-i", "1", "-j", "3"},
                "-i is not used with --table (the table depends on j)"},
        BadArgs{
            "T5WithoutI", {"t5", "--heads", "2", "-j", "3"}, "-i is required (or --table with -j)"},
        BadArgs{"T5BucketsWithoutI", {"t5", "-j", "3", "--buckets"}, "-i is required"},
        BadArgs{"T5BucketsAndTable",
                {"t5", "--heads", "2", "-i", "1", "-j", "1", "--table", "--buckets"},
                "excludes"},
        BadArgs{"T5BucketWithoutRel", {"t5-bucket"}, "--rel is required"},
        BadArgs{"T5BucketRelNotANumber", {"t5-bucket", "--rel", "1,x"}, "--rel"},
        BadArgs{"T5BucketTooFewBuckets",
                {"t5-bucket", "--rel", "1", "--num-buckets", "3"},
                "num_buckets"},
        BadArgs{"AttentionWithoutHeads",
                {"attention", "-i", "1", "-j", "1", "-d", "4"},
                "--heads is required (or --inputs)"},
        BadArgs{"AttentionWithoutD",
                {"attention", "--heads", "2", "-i", "1", "-j", "1"},
                "-d is required"},
        BadArgs{"AttentionHeadsNotAMultipleOfKvHeads",
                {"attention", "--batch", "2", "--heads", "6", "--kv-heads", "4", "-i", "3", "-j",
                 "5", "-d", "8"},
                "the query heads h = 6 must be a multiple of the key/value heads hk = 4 (q [2, 6, "
                "3, 8], k [2, 4, 5, 8], v [2, 4, 5, 8])"},
        BadArgs{"AttentionZeroD",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", "0"},
                "d must be >= 1, got 0"},
        BadArgs{"AttentionNegativeI",
                {"attention", "--heads", "2", "-i", "-1", "-j", "1", "-d", "4"},
                "-i must be >= 0, got -1"},
        BadArgs{"AttentionNegativeJ",
                {"attention", "--heads", "2", "-i", "1", "-j", "-5", "-d", "4"},
                "-j must be >= 0, got -5"},
        BadArgs{"AttentionNegativeBatch",
                {"attention", "--batch", "-1", "--heads", "2", "-i", "1", "-j", "1", "-d", "4"},
                "--batch must be >= 0, got -1"},
        BadArgs{"AttentionUnknownBias",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", "4", "--bias", "rope"},
                "rope"},
        BadArgs{"AttentionNanScale",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", "4", "--scale", "nan"},
                "scale must be finite"},
        BadArgs{"AttentionInfiniteScale",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", "4", "--scale", "inf"},
                "scale must be finite"},
        BadArgs{"AttentionTableIAboveJ",
                {"attention", "--heads", "2", "-i", "5", "-j", "3", "-d", "4", "--bias", "table"},
                "non-causal attention needs i <= j, got i = 5, j = 3"},
        BadArgs{"AttentionTooLarge",
                {"attention", "--heads", "64", "-i", "1000000", "-j", "1000000", "-d", "1000000"},
                "[1, 64, 1000000, 1000000]"},
        BadArgs{"AttentionDenseTooLarge",
                {"attention", "--heads", "64", "-i", "1000000", "-j", "1000000", "-d", "1",
                 "--bias", "dense"},
                "[1, 64, 1000000, 1000000]"},
        BadArgs{"AttentionWrongSlopeCount",
                {"attention", "--heads", "4", "-i", "1", "-j", "1", "-d", "4", "--bias", "alibi",
                 "--slopes", "0.5,0.25"},
                "got 2 slopes for h = 4"},
        BadArgs{"AttentionInfiniteSlope",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--bias", "alibi",
                 "--slopes", "inf"},
                "finite"},
        BadArgs{"AttentionNanSlopeNamesTheShapes",
                {"attention", "--heads", "2", "-i", "1", "-j", "3", "-d", "4", "--bias", "alibi",
                 "--slopes", "0.5,nan"},
                "attention_forward: ALiBi slope 1 is not finite (nan) (q [1, 2, 1, 4], k [1, 2, 3, 4], "
                "v [1, 2, 3, 4])"},
        BadArgs{"AttentionSlopesWithoutAlibi",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--slopes", "0.5"},
                "--slopes is an option of --bias alibi"},
        BadArgs{
            "AttentionTableFromWithoutTable",
            {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--table-from", "t5"},
            "--table-from is an option of --bias table"},
        BadArgs{"AttentionUnknownTableFrom",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--bias", "table",
                 "--table-from", "rope"},
                "rope"},
        BadArgs{"AttentionUnknownDtype",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--dtype", "int8"},
                "int8"},
        BadArgs{"AttentionUnknownFormat",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--format", "xml"},
                "xml"},
        BadArgs{"AttentionNegativeSeed",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--seed", "-3"},
                "--seed must be an integer"},
        BadArgs{"AttentionZeroHeadsAlibi",
                {"attention", "--heads", "0", "-i", "1", "-j", "1", "-d", "4", "--bias", "alibi"},
                "heads must be >= 1, got 0"},
        BadArgs{"CheckGoldenWithoutFile", {"check-golden"}, "file is required"},
        BadArgs{"CheckGoldenTwoFiles", {"check-golden", "a.json", "b.json"}, "b.json"},
        BadArgs{"BenchWithoutSuite", {"bench"}, "suite is required"},
        BadArgs{"BenchUnknownSuite", {"bench", "no-such-suite", "--quick"}, "no-such-suite"},
        BadArgs{"BenchZeroRepetitions",
                {"bench", "alibi", "--repetitions", "0"},
                "--repetitions must be >= 1, got 0"},
        BadArgs{"BenchNegativeWarmup",
                {"bench", "alibi", "--warmup", "-1"},
                "--warmup must be >= 0, got -1"},
        // An empty value: CLI11 2.1 reads it as 0 or as "not given" unless
        // refused (cli/app.cc, refuse_empty_values); every option kind.
        BadArgs{"SlopesEmptyHeads", {"slopes", "--heads", ""}, "--heads: the value is empty ('')"},
        BadArgs{"SlopesEmptyMaxBias",
                {"slopes", "--heads", "8", "--max-bias", ""},
                "--max-bias: the value is empty ('')"},
        BadArgs{"SlopesEmptyRange",
                {"slopes", "--heads", "8", "--range", ""},
                "--range: the value is empty ('')"},
        BadArgs{"AlibiEmptySlopes",
                {"alibi", "--slopes", "", "-i", "1", "-j", "2"},
                "--slopes: the value is empty ('')"},
        BadArgs{"AlibiEmptyI",
                {"alibi", "--heads", "2", "-i", "", "-j", "2"},
                "-i: the value is empty ('')"},
        BadArgs{"AlibiEmptyJ",
                {"alibi", "--heads", "2", "-i", "1", "-j", ""},
                "-j: the value is empty ('')"},
        BadArgs{"AlibiEmptyTotalHeads",
                {"alibi", "--heads", "2", "--total-heads", "", "-i", "1", "-j", "2"},
                "--total-heads: the value is empty ('')"},
        BadArgs{"AlibiEmptyDtype",
                {"alibi", "--heads", "2", "-i", "1", "-j", "2", "--dtype", ""},
                "--dtype: the value is empty ('')"},
        BadArgs{"AlibiEmptyPlot",
                {"alibi", "--heads", "2", "-i", "1", "-j", "2", "--plot", ""},
                "--plot: the value is empty ('')"},
        // Comma items: CLI11's own delimiter would drop the empty ones.
        BadArgs{"AlibiEmptySlopeItem",
                {"alibi", "--heads", "2", "--slopes", "0.5,,0.25", "-i", "1", "-j", "2"},
                "--slopes: item 2 of \"0.5,,0.25\" is empty"},
        BadArgs{"AlibiTrailingCommaInSlopes",
                {"alibi", "--slopes", "0.5,", "-i", "1", "-j", "2"},
                "--slopes: item 2 of \"0.5,\" is empty"},
        BadArgs{"AlibiSlopePastFloat32",
                {"alibi", "--slopes", "1e39", "-i", "1", "-j", "2"},
                "--slopes: \"1e39\" is past the float32 range"},
        BadArgs{"AlibiBiasEmptySlopes",
                {"alibi-bias", "--heads", "1", "--slopes", "", "-i", "2", "-j", "2"},
                "--slopes: the value is empty ('')"},
        BadArgs{"AlibiBiasEmptyHeads",
                {"alibi-bias", "--heads", "", "-i", "2", "-j", "2"},
                "--heads: the value is empty ('')"},
        BadArgs{"AlibiBiasEmptyQLen",
                {"alibi-bias", "--heads", "1", "-i", "", "-j", "2"},
                "--q-len: the value is empty ('')"},
        BadArgs{"DpbEmptyDim",
                {"dpb", "--dim", "", "--heads", "2", "-i", "1", "-j", "1"},
                "--dim: the value is empty ('')"},
        BadArgs{"DpbEmptyDepth",
                {"dpb", "--dim", "4", "--heads", "2", "--variant", "x-transformers", "--depth", "",
                 "-i", "1", "-j", "1"},
                "--depth: the value is empty ('')"},
        BadArgs{"DpbEmptySeed",
                {"dpb", "--dim", "4", "--heads", "2", "-i", "1", "-j", "1", "--seed", ""},
                "--seed: the value is empty ('')"},
        BadArgs{"DpbEmptySave",
                {"dpb", "--dim", "4", "--heads", "2", "--save", ""},
                "--save: the value is empty ('')"},
        BadArgs{"T5EmptyHeads",
                {"t5", "--heads", "", "-i", "1", "-j", "1"},
                "--heads: the value is empty ('')"},
        BadArgs{"T5EmptyScale",
                {"t5", "--heads", "2", "-i", "1", "-j", "1", "--scale", ""},
                "--scale: the value is empty ('')"},
        BadArgs{"T5EmptyNumBuckets",
                {"t5", "-i", "1", "-j", "1", "--buckets", "--num-buckets", ""},
                "--num-buckets: the value is empty ('')"},
        BadArgs{"T5EmptyMaxDistance",
                {"t5", "--heads", "2", "-i", "1", "-j", "1", "--max-distance", ""},
                "--max-distance: the value is empty ('')"},
        BadArgs{"T5BucketEmptyRel", {"t5-bucket", "--rel", ""}, "--rel: the value is empty ('')"},
        BadArgs{"T5BucketEmptyRelItem",
                {"t5-bucket", "--rel", "1,,2"},
                "--rel: item 2 of \"1,,2\" is empty"},
        BadArgs{"T5BucketRelPastInt64",
                {"t5-bucket", "--rel", "1,99999999999999999999"},
                "--rel: item 2 of \"1,99999999999999999999\" (\"99999999999999999999\") does not fit "
                "in a 64-bit integer"},
        BadArgs{"AttentionEmptyD",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", ""},
                "-d: the value is empty ('')"},
        BadArgs{"AttentionEmptyBatch",
                {"attention", "--batch", "", "--heads", "2", "-i", "1", "-j", "1", "-d", "4"},
                "--batch: the value is empty ('')"},
        BadArgs{"AttentionEmptyKvHeads",
                {"attention", "--heads", "2", "--kv-heads", "", "-i", "1", "-j", "1", "-d", "4"},
                "--kv-heads: the value is empty ('')"},
        BadArgs{"AttentionEmptyScale",
                {"attention", "--heads", "2", "-i", "1", "-j", "1", "-d", "4", "--scale", ""},
                "--scale: the value is empty ('')"},
        BadArgs{"AttentionEmptySlopes",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--bias", "alibi",
                 "--slopes", ""},
                "--slopes: the value is empty ('')"},
        BadArgs{"AttentionCommaAsSlopes",
                {"attention", "--heads", "1", "-i", "1", "-j", "1", "-d", "4", "--bias", "alibi",
                 "--slopes", ","},
                "--slopes: item 1 of \",\" is empty"},
        BadArgs{"AttentionEmptyInputs",
                {"attention", "--inputs", ""},
                "--inputs: the value is empty ('')"},
        BadArgs{"DemoEmptyLength", {"demo", "--length", ""}, "--length: the value is empty ('')"},
        BadArgs{"DemoEmptyRepetitions",
                {"demo", "--repetitions", ""},
                "--repetitions: the value is empty ('')"},
        BadArgs{"DemoEmptyOut", {"demo", "--out", ""}, "--out: the value is empty ('')"},
        BadArgs{"CheckGoldenEmptyFile", {"check-golden", ""}, "file: the value is empty ('')"},
        BadArgs{"BenchEmptyRepetitions",
                {"bench", "alibi", "--repetitions", ""},
                "--repetitions: the value is empty ('')"},
        BadArgs{"BenchEmptyWarmup",
                {"bench", "alibi", "--warmup", ""},
                "--warmup: the value is empty ('')"}),
    [](const testing::TestParamInfo<BadArgs>& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace posbias::cli
