// `posbias slopes`, `posbias alibi` and `posbias alibi-bias`: one library call
// each, printed like PyTorch's print(tensor) or as JSON.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "bias_plot.h"
#include "posbias/limits.h"
#include "commands.h"
#include "posbias/alibi.h"
#include "posbias/dtype.h"
#include "posbias/slopes.h"
#include "posbias/tensor.h"

namespace posbias::cli {
namespace {

constexpr const char* kFormatHelp =
    "text: like print(tensor) in PyTorch; json: {\"shape\": [...], \"data\": "
    "[...]}, row-major, every value, exact";

// The whole string by the tool's one integer rule (parse_decimal); nullopt
// if it is not one.
std::optional<std::int64_t> parse_int64(const std::string& text) {
  std::int64_t value = 0;
  if (parse_decimal(text, value)) return std::nullopt;
  return value;
}

// "H0:H1" -> {H0, H1}.
std::pair<std::int64_t, std::int64_t> parse_head_range(const std::string& text) {
  const std::size_t colon = text.find(':');
  if (colon != std::string::npos) {
    const auto h0 = parse_int64(text.substr(0, colon));
    const auto h1 = parse_int64(text.substr(colon + 1));
    if (h0 && h1) return {*h0, *h1};
  }
  throw std::invalid_argument("--range must be H0:H1 (two base-10 integers, heads [H0, H1)), got " +
                              posbias::quoted_name(text));
}

CLI::Option* add_slopes_option(CLI::App& sub, std::vector<float>& slopes, const std::string& help) {
  return add_float_list_option(sub, "--slopes", slopes, help)->type_name("S1,S2,...");
}

}  // namespace

CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& description,
                      const std::string& footer) {
  CLI::App* sub = app.add_subcommand(name, description);
  sub->footer(footer);
  return sub;
}

void add_plot_option(CLI::App& sub, std::string& path) {
  sub.add_option("--plot", path,
                 "Draw the bias as a heatmap into FILE (.png or .svg) instead of printing it: one "
                 "panel per head, a shared colour scale, block means past 256 x 256")
      ->type_name("FILE");
}

void add_format_option(CLI::App& sub, std::string& format) {
  sub.add_option("--format", format, kFormatHelp)
      ->check(CLI::IsMember({"text", "json"}))
      ->default_str("text");
}

void print_tensor(std::ostream& out, const Tensor& t, const std::string& format) {
  if (format == "json") {
    write_json(out, t);
  } else {
    out << format_tensor(t);
  }
  out << '\n';
}

// ------------------------------------------------------------------ slopes

Command add_slopes_command(CLI::App& app) {
  struct Args {
    std::int64_t heads = 0;
    std::optional<float> max_bias;
    std::string range;
    std::string format = "text";
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub =
      add_command(app, "slopes", "The ALiBi slopes of N heads",
                  "The paper's schedule (x-transformers, BLOOM, MPT), or with --max-bias ggml's\n"
                  "/ MPT's. --range H0:H1 gives heads [H0, H1) of the N-head schedule, what a\n"
                  "tensor-parallel rank holding them needs.\n"
                  "Example:\n"
                  "  posbias slopes --heads 12 --range 8:12 --format json");
  add_int64_option(*sub, "--heads", args->heads, "Number of heads N (>= 1)")->required();
  sub->add_option("--max-bias", args->max_bias,
                  "ggml / MPT max_bias (8 gives the standard slopes; <= 0 gives "
                  "slope 1 for every head, as in ggml)");
  sub->add_option("--range", args->range,
                  "Only heads [H0, H1) of the N-head schedule, as a rank holding "
                  "those heads needs them")
      ->type_name("H0:H1");
  add_format_option(*sub, args->format);

  return {sub, [args](std::ostream& out) {
            std::vector<float> slopes;
            if (args->range.empty()) {
              slopes = args->max_bias ? alibi_slopes_max_bias(args->heads, *args->max_bias)
                                      : alibi_slopes(args->heads);
            } else {
              const auto [h0, h1] = parse_head_range(args->range);
              slopes = args->max_bias
                           ? alibi_slopes_range_max_bias(args->heads, h0, h1, *args->max_bias)
                           : alibi_slopes_range(args->heads, h0, h1);
            }
            const auto n = static_cast<std::int64_t>(slopes.size());
            print_tensor(out, Tensor::from_vector({n}, slopes), args->format);
            return 0;
          }};
}

// ------------------------------------------------------------------- alibi

Command add_alibi_command(CLI::App& app) {
  struct Args {
    std::optional<std::int64_t> heads;
    std::optional<std::int64_t> total_heads;
    std::int64_t i = 0;
    std::int64_t j = 0;
    std::string dtype = "float32";
    std::string format = "text";
    std::vector<float> slopes;
    std::string plot;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub =
      add_command(app, "alibi", "The ALiBi bias AlibiPositionalBias(H, T).forward(i, j)",
                  "Shape [T, i, j]: bias[h][r][c] = -slope[h] * |c - (j - i + r)| for h < H\n"
                  "(the queries are the last i of the j keys), 0 for heads H..T-1.\n"
                  "--plot FILE draws it instead of printing it (see `posbias dpb --help`).\n"
                  "Examples:\n"
                  "  posbias alibi --heads 4 --total-heads 8 -i 8 -j 15\n"
                  "  posbias alibi --heads 8 -i 4096 -j 4096 --plot alibi.png");
  add_int64_option(*sub, "--heads", args->heads,
                   "Biased heads H (>= 1); may be left out with --slopes");
  add_int64_option(*sub, "--total-heads", args->total_heads,
                   "All heads T (>= H; default H); the last T - H get no bias");
  add_int64_option(*sub, "-i", args->i, "Query length (>= 0)")->required();
  add_int64_option(*sub, "-j", args->j, "Key length (>= 0)")->required();
  sub->add_option("--dtype", args->dtype,
                  "Output dtype: float32, bfloat16 or float16 (computed in "
                  "float32, rounded once)")
      ->default_str("float32");
  add_format_option(*sub, args->format);
  add_slopes_option(*sub, args->slopes,
                    "Custom slopes, one per biased head (default: alibi_slopes(H)); used as "
                    "given, positive slopes penalise distance");
  add_plot_option(*sub, args->plot);

  return {sub, [args](std::ostream& out) {
            if (!args->plot.empty()) check_plot_path(args->plot);
            const DType dtype = parse_dtype(args->dtype);
            if (!args->heads && args->slopes.empty()) {
              throw std::invalid_argument("--heads is required (or give --slopes)");
            }
            const std::int64_t heads =
                args->heads.value_or(static_cast<std::int64_t>(args->slopes.size()));
            const AlibiPositionalBias module =
                args->slopes.empty()
                    ? AlibiPositionalBias(heads, args->total_heads, dtype)
                    : AlibiPositionalBias(heads, args->total_heads, args->slopes, dtype);
            if (!args->plot.empty()) {
              plot::check_plot_size("--plot", module.total_heads(), args->i, args->j);
              const ToeplitzBias bias = alibi_toeplitz(module, args->i, args->j, dtype);
              std::string title = "AlibiPositionalBias(heads=" + std::to_string(heads) +
                                  ", total_heads=" + std::to_string(module.total_heads()) +
                                  ").forward(" + std::to_string(args->i) + ", " +
                                  std::to_string(args->j) + ")";
              if (dtype != DType::kFloat32) title += " " + dtype_name(dtype);
              const std::string what = plot::write_heatmap(
                  "--plot", args->plot,
                  toeplitz_heatmap(bias, title,
                                   alibi_panel_titles(module.slopes(), module.total_heads())));
              out << "wrote " << args->plot << ": " << what << "\n";
              return 0;
            }
            print_tensor(out, module.forward(args->i, args->j), args->format);
            return 0;
          }};
}

// -------------------------------------------------------------- alibi-bias

Command add_alibi_bias_command(CLI::App& app) {
  struct Args {
    std::int64_t heads = 0;
    bool causal = true;
    std::int64_t q_len = 0;
    std::int64_t k_len = 0;
    std::string dtype = "float32";
    std::string format = "text";
    std::vector<float> slopes;
    CLI::Option* slopes_option = nullptr;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = add_command(
      app, "alibi-bias", "The \"ALiBi\" seed's AlibiBias(n_heads, causal).build(q_len, k_len)",
      "Shape [1, n_heads, q_len, k_len] with the seed's top-left positions (query\n"
      "r, key c): bias = slope * max(r - c, 0) (causal) or slope * |r - c|, the\n"
      "slopes used with their sign.\n"
      "The seed's worked example:\n"
      "  posbias alibi-bias --heads 1 --no-causal --slopes -0.2 -i 3 -j 3");
  add_int64_option(*sub, "--heads,--n-heads", args->heads, "Number of heads (>= 1)")->required();
  sub->add_flag("--causal,!--no-causal", args->causal,
                "Causal distance max(r - c, 0) (the default; future keys get 0, "
                "masking them is separate) or, with --no-causal, |r - c|");
  add_int64_option(*sub, "-i,--q-len", args->q_len, "Query length (>= 0)")->required();
  add_int64_option(*sub, "-j,--k-len", args->k_len, "Key length (>= 0)")->required();
  sub->add_option("--dtype", args->dtype, "Output dtype: float32, bfloat16 or float16")
      ->default_str("float32");
  add_format_option(*sub, args->format);
  args->slopes_option =
      add_slopes_option(*sub, args->slopes,
                        "Custom slopes, one per head, used with their sign (default: the seed's "
                        "linspace(-0.05, -0.5, n_heads))");

  return {sub, [args](std::ostream& out) {
            const DType dtype = parse_dtype(args->dtype);
            const AlibiBias builder = args->slopes_option->count() > 0
                                          ? AlibiBias(args->heads, args->causal, args->slopes)
                                          : AlibiBias(args->heads, args->causal);
            print_tensor(out, builder.build(args->q_len, args->k_len, dtype), args->format);
            return 0;
          }};
}

}  // namespace posbias::cli
