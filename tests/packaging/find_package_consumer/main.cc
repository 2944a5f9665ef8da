// A program that uses posbias as a downstream user would. The packaging test
// builds it against an installed posbias twice: through find_package(posbias)
// and through `pkg-config --cflags --libs posbias`. Exit code 0 when every
// result is right; otherwise one line per wrong value on stderr.
#include <posbias/posbias.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

int g_failures = 0;

void expect_eq(float got, float want, const char* what, std::int64_t index) {
  if (got != want) {
    std::fprintf(stderr, "FAILED: %s [%lld]: got %.9g, want %.9g\n", what,
                 static_cast<long long>(index), static_cast<double>(got),
                 static_cast<double>(want));
    ++g_failures;
  }
}

}  // namespace

int main() {
  // alibi_slopes(8) is 2^-1, 2^-2, ..., 2^-8: exact in float32.
  const std::vector<float> slopes = posbias::alibi_slopes(8);
  if (slopes.size() != 8) {
    std::fprintf(stderr, "FAILED: alibi_slopes(8) has %zu entries\n",
                 slopes.size());
    return 1;
  }
  for (int h = 0; h < 8; ++h) {
    expect_eq(slopes[static_cast<std::size_t>(h)], std::ldexp(1.0f, -(h + 1)),
              "alibi_slopes(8)", h);
  }

  // Heads 4 of 8: slopes 2^-2, 2^-4, 2^-6, 2^-8, then four zero heads. The
  // queries are the last i = 3 of j = 5 positions, so row r sits at 2 + r and
  // bias[h][r][c] = -slope[h] * |c - (2 + r)|.
  const posbias::Tensor bias = posbias::AlibiPositionalBias(4, 8).forward(3, 5);
  const std::vector<std::int64_t> want_shape = {8, 3, 5};
  if (bias.shape() != want_shape) {
    std::fprintf(stderr, "FAILED: forward(3, 5) has %lld dimensions, want "
                 "shape [8, 3, 5]\n", static_cast<long long>(bias.dim()));
    return 1;
  }
  const std::vector<float> values = bias.to_float_vector();
  std::int64_t k = 0;
  for (int h = 0; h < 8; ++h) {
    const float slope = h < 4 ? std::ldexp(1.0f, -2 * (h + 1)) : 0.0f;
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 5; ++c, ++k) {
        const float want = -slope * static_cast<float>(std::abs(c - (2 + r)));
        expect_eq(values[static_cast<std::size_t>(k)], want,
                  "AlibiPositionalBias(4, 8).forward(3, 5), row-major", k);
      }
    }
  }
  expect_eq(bias.at({0, 0, 0}), -0.5f, "forward(3, 5) at [0, 0, 0]", 0);

  // The library linked is the one the headers describe.
  if (std::strcmp(posbias::version(), POSBIAS_VERSION_STRING) != 0) {
    std::fprintf(stderr, "FAILED: library version %s, headers %s\n",
                 posbias::version(), POSBIAS_VERSION_STRING);
    ++g_failures;
  }

  if (g_failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("posbias %s: slopes and bias as expected\n", posbias::version());
  return 0;
}
