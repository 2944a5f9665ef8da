// `posbias dpb`, `posbias t5` and `posbias t5-bucket`: the trainable biases
// (DynamicPositionBias, T5's RelativePositionBias) from the command line,
// printed like `posbias alibi` prints ALiBi.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "bias_plot.h"
#include "posbias/limits.h"
#include "commands.h"
#include "posbias/dpb.h"
#include "posbias/dtype.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"

namespace posbias::cli {

// The whole string as an unsigned 64-bit seed, by the tool's one integer
// rule (parse_decimal: base 10, an optional '+').
std::uint64_t parse_seed(const std::string& text) {
  std::uint64_t value = 0;
  if (parse_decimal(text, value)) {
    throw std::invalid_argument("--seed must be an integer in [0, 18446744073709551615], got " +
                                posbias::quoted_name(text));
  }
  return value;
}

void add_seed_option(CLI::App& sub, std::string& seed, const std::string& help) {
  sub.add_option("--seed", seed, help)->type_name("UINT64")->default_str("0");
}

// Runs `io`, a file read or write the user asked for. The library reports
// I/O failures (no such file, a directory, no permission) as
// std::runtime_error; for the tool a path that cannot be used is a bad
// argument (exit code 2), so they become std::invalid_argument, naming the
// option and the path.
void file_argument(const std::string& option, const std::string& path,
                   const std::function<void()>& io) {
  try {
    io();
  } catch (const std::runtime_error& e) {
    std::string message = e.what();
    if (message.find(path) == std::string::npos)
      message = posbias::quoted_name(path) + ": " + message;
    throw std::invalid_argument(option + ": " + message);
  }
}

namespace {

// ----------------------------------------------------------------- helpers

void require_length(const std::optional<std::int64_t>& value, const char* name,
                    const std::string& alternatives) {
  if (!value) throw std::invalid_argument(std::string(name) + " is required" + alternatives);
}

// Integers printed like PyTorch prints an int64 tensor: every value
// right-aligned to the widest one shown, lines wrapped at 80 columns, and
// past 1000 elements only the first and last 3 entries of each dimension.
// `value(r, c)` gives element [r][c] of a [rows, cols] grid.
class IntGridFormatter {
 public:
  IntGridFormatter(std::int64_t rows, std::int64_t cols,
                   std::function<std::int64_t(std::int64_t, std::int64_t)> value)
      : rows_(rows), cols_(cols), value_(std::move(value)) {
    // (rows and cols up to kThreshold cannot overflow the product.)
    summarize_ = rows > 0 && cols > 0 &&
                 (rows > kThreshold || cols > kThreshold || rows * cols > kThreshold);
    for (std::int64_t r : shown(rows_)) {
      for (std::int64_t c : shown(cols_)) {
        width_ = std::max(width_, std::to_string(value_(r, c)).size());
      }
    }
  }

  std::string format() const {
    if (rows_ == 0 || cols_ == 0) {
      return "tensor([], size=(" + std::to_string(rows_) + ", " + std::to_string(cols_) +
             "), dtype=torch.int64)";
    }
    constexpr std::size_t kIndent = 7;  // "tensor("
    std::string s = "tensor([";
    const std::vector<std::int64_t> rows = shown(rows_);
    const std::string row_separator = ",\n" + std::string(kIndent + 1, ' ');
    for (std::size_t k = 0; k < rows.size(); ++k) {
      if (k > 0) s += row_separator;
      if (summarized(rows_) && k == kEdge) s += "..." + row_separator;
      s += row(rows[k], kIndent + 1);
    }
    return s + "])";
  }

 private:
  static constexpr std::int64_t kThreshold = 1000;
  static constexpr std::size_t kEdge = 3;
  static constexpr std::size_t kLineWidth = 80;

  bool summarized(std::int64_t extent) const {
    return summarize_ && extent > static_cast<std::int64_t>(2 * kEdge);
  }

  // The indices printed along a dimension of `extent`.
  std::vector<std::int64_t> shown(std::int64_t extent) const {
    std::vector<std::int64_t> index;
    if (summarized(extent)) {
      for (std::int64_t k = 0; k < static_cast<std::int64_t>(kEdge); ++k) index.push_back(k);
      for (std::int64_t k = extent - static_cast<std::int64_t>(kEdge); k < extent; ++k) {
        index.push_back(k);
      }
    } else {
      for (std::int64_t k = 0; k < extent; ++k) index.push_back(k);
    }
    return index;
  }

  std::string cell(std::int64_t v) const {
    const std::string text = std::to_string(v);
    return std::string(width_ - text.size(), ' ') + text;
  }

  std::string row(std::int64_t r, std::size_t indent) const {
    std::vector<std::string> items;
    const std::vector<std::int64_t> cols = shown(cols_);
    for (std::size_t k = 0; k < cols.size(); ++k) {
      if (summarized(cols_) && k == kEdge) items.emplace_back(" ...");
      items.push_back(cell(value_(r, cols[k])));
    }
    const std::size_t element_length = width_ + 2;
    const std::size_t per_line =
        std::max<std::size_t>(1, (kLineWidth > indent ? kLineWidth - indent : 0) / element_length);
    std::string s = "[";
    for (std::size_t k = 0; k < items.size(); ++k) {
      if (k > 0) s += k % per_line == 0 ? ",\n" + std::string(indent + 1, ' ') : ", ";
      s += items[k];
    }
    return s + "]";
  }

  std::int64_t rows_;
  std::int64_t cols_;
  std::function<std::int64_t(std::int64_t, std::int64_t)> value_;
  bool summarize_ = false;
  std::size_t width_ = 1;
};

// The bound on a streamed [rows, cols] grid of buckets (--buckets --format
// json writes every one): the one the tensor outputs have, that the grid as
// the int64 tensor torch holds (relative_position_bucket) fits in this
// machine's memory; std::length_error (exit 2) naming the shape and bytes
// otherwise, before anything is written. Without it a 1e6 x 1e6 grid (some
// 4e12 bytes of JSON) would print for days.
void check_streamed_grid_size(std::int64_t rows, std::int64_t cols) {
  const std::string what = "--buckets --format json: the bucket grid [" + std::to_string(rows) +
                           ", " + std::to_string(cols) + "] (int64)";
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(rows, cols, &bytes) ||
      __builtin_mul_overflow(bytes, std::int64_t{8}, &bytes)) {
    throw std::length_error(what + " is too large: its size in bytes overflows int64");
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return;
  const auto memory = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size);
  if (static_cast<std::uint64_t>(bytes) > memory) {
    throw std::length_error(what + " needs " + std::to_string(bytes) +
                            " bytes, more than this machine's " + std::to_string(memory) +
                            " bytes of memory (without --format json the grid is summarised)");
  }
}

// {"shape": [rows, cols], "data": [...]}, every value, streamed.
void write_int_grid_json(std::ostream& out, std::int64_t rows, std::int64_t cols,
                         const std::function<std::int64_t(std::int64_t, std::int64_t)>& value) {
  out << "{\"shape\": [" << rows << ", " << cols << "], \"data\": [";
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      if (r > 0 || c > 0) out << ", ";
      out << value(r, c);
    }
  }
  out << "]}\n";
}

// --------------------------------------------------------------------- dpb

struct DpbArgs {
  std::int64_t dim = 0;
  std::int64_t heads = 0;
  std::optional<std::int64_t> i;
  std::optional<std::int64_t> j;
  std::string seed = "0";
  std::string weights;
  std::string save;
  std::string variant = "zeta";
  std::int64_t depth = 2;
  bool log_distance = false;
  bool norm = false;
  bool table = false;
  std::string dtype = "float32";
  std::string format = "text";
  std::string plot;
};

DpbOptions dpb_options(const DpbArgs& a) {
  DpbOptions o;
  o.dim = a.dim;
  o.heads = a.heads;
  if (a.variant == "x-transformers") {
    o.variant = DpbVariant::kXTransformers;
    o.depth = a.depth;
    o.log_distance = a.log_distance;
    o.norm = a.norm;
    return o;
  }
  // zeta's MLP is fixed; say which option asked for something else (a depth
  // below 1 is left to the library's message).
  if (a.log_distance || a.norm || (a.depth >= 1 && a.depth != 2)) {
    throw std::invalid_argument(
        "--depth, --log-distance and --norm are options of --variant x-transformers (zeta's MLP "
        "has depth 2, plain distances, no LayerNorm); got --depth " +
        std::to_string(a.depth) + (a.log_distance ? " --log-distance" : "") +
        (a.norm ? " --norm" : ""));
  }
  o.depth = a.depth;
  return o;
}

std::string shape_list(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

}  // namespace

Command add_dpb_command(CLI::App& app) {
  auto args = std::make_shared<DpbArgs>();
  CLI::App* sub = add_command(
      app, "dpb", "The Dynamic Position Bias DynamicPositionBias(dim, heads).forward(i, j)",
      "Shape [heads, i, j]: an MLP on the distances between the query of row r,\n"
      "at position j - i + r (the queries are the last i of the j keys), and key c.\n"
      "zeta: Linear(1,dim) SiLU Linear(dim,dim) SiLU Linear(dim,heads) on |q - c|;\n"
      "x-transformers: --depth blocks of Linear [LayerNorm] SiLU, then\n"
      "Linear(dim,heads), on the signed q - c (sign(x) ln(|x| + 1) with\n"
      "--log-distance). i and j are lengths: -i 0 gives an empty [heads, 0, j].\n"
      "Parameters: PyTorch's nn.Linear initialisation from --seed, or a safetensors\n"
      "state dict written by PyTorch (torch state-dict names, e.g. mlp.0.weight)\n"
      "with --weights. --table prints the per-distance table instead.\n"
      "Examples:\n"
      "  posbias dpb --dim 64 --heads 8 -i 5 -j 5 --seed 1\n"
      "  posbias dpb --dim 64 --heads 8 -i 1 -j 4096 --weights dpb.safetensors --format json\n"
      "  posbias dpb --dim 64 --heads 8 --seed 1 --save dpb.safetensors\n"
      "  posbias dpb --dim 64 --heads 8 -i 64 -j 64 --seed 1 --plot dpb.png\n"
      "--plot FILE (also on `alibi` and `t5`) draws the bias instead of printing it:\n"
      "PNG or SVG by the file's extension, one panel per head, one colour scale\n"
      "for all heads, block means past 256 x 256 cells per panel (said in the\n"
      "title), at most 64 heads and 2^28 values. The file is written through a\n"
      "temporary file in the same directory and renamed: never half-written.");
  add_int64_option(*sub, "--dim", args->dim, "Hidden width of the MLP (>= 1)")->required();
  add_int64_option(*sub, "--heads", args->heads, "Number of heads (>= 1)")->required();
  add_int64_option(*sub, "-i", args->i, "Query length, 0 <= i <= j (not with --table)");
  add_int64_option(*sub, "-j", args->j, "Key length (>= 0; >= 1 with --table)");
  CLI::Option* seed = sub->add_option(
      "--seed", args->seed,
      "Seed of the initial parameters (PyTorch's nn.Linear distribution, not torch's numbers)");
  seed->type_name("UINT64")->default_str("0");
  CLI::Option* weights =
      sub->add_option("--weights", args->weights,
                      "Load the parameters from a safetensors state dict (PyTorch's names and "
                      "shapes for --dim, --heads and the variant)")
          ->type_name("FILE");
  seed->excludes(weights);
  sub->add_option("--save", args->save,
                  "Write the parameters (seeded or loaded) to FILE as safetensors, loadable by "
                  "PyTorch's load_state_dict; without -i and -j nothing else is printed")
      ->type_name("FILE");
  sub->add_option("--variant", args->variant,
                  "zeta (the default, the documentation's module) or x-transformers")
      ->check(CLI::IsMember({"zeta", "x-transformers"}))
      ->default_str("zeta");
  add_int64_option(*sub, "--depth", args->depth,
                   "Hidden blocks of the x-transformers MLP (>= 1, default 2)");
  sub->add_flag("--log-distance", args->log_distance,
                "x-transformers: feed sign(x) ln(|x| + 1) instead of the distance x");
  sub->add_flag("--norm", args->norm, "x-transformers: LayerNorm in each hidden block");
  sub->add_flag("--table", args->table,
                "Print the compact table(j) instead: zeta [heads, j] by distance |q - c|, "
                "x-transformers [heads, 2j - 1] at (q - c) + j - 1");
  sub->add_option("--dtype", args->dtype,
                  "Output dtype: float32, bfloat16 or float16 (computed in float32, rounded once)")
      ->default_str("float32");
  add_format_option(*sub, args->format);
  CLI::Option* plot_option = sub->add_option(
      "--plot", args->plot,
      "Draw the bias as a heatmap into FILE (.png or .svg) instead of printing it: one panel per "
      "head, a shared colour scale, block means past 256 x 256");
  plot_option->type_name("FILE");

  return {sub, [args](std::ostream& out) {
            if (!args->plot.empty()) {
              check_plot_path(args->plot);
              if (args->table)
                throw std::invalid_argument("--plot draws forward(i, j), not --table");
              require_length(args->i, "-i", " with --plot");
              require_length(args->j, "-j", " with --plot");
            }
            const DType dtype = parse_dtype(args->dtype);
            const DpbOptions options = dpb_options(*args);
            // Check the lengths given before anything is written.
            if (args->table) {
              if (args->i) {
                throw std::invalid_argument("-i is not used with --table (the table depends on j)");
              }
              require_length(args->j, "-j", " with --table");
            } else if (args->i || args->j || args->save.empty()) {
              const std::string alternatives = " (or --table with -j, or --save FILE)";
              require_length(args->i, "-i", alternatives);
              require_length(args->j, "-j", alternatives);
            }

            DynamicPositionBias module(options, parse_seed(args->seed));
            if (!args->weights.empty()) {
              file_argument("--weights", args->weights, [&] { module.load(args->weights); });
            }
            if (!args->plot.empty()) {
              if (*args->i > *args->j) module.forward(*args->i, *args->j);  // its message
              plot::check_plot_size("--plot", options.heads, *args->i, *args->j);
              const ToeplitzBias bias = dpb_toeplitz(module, *args->i, *args->j, dtype);
              std::string title = "DynamicPositionBias(dim=" + std::to_string(args->dim) +
                                  ", heads=" + std::to_string(args->heads) + ")" +
                                  (args->variant == "zeta" ? "" : " x-transformers") + ".forward(" +
                                  std::to_string(*args->i) + ", " + std::to_string(*args->j) + ")";
              if (dtype != DType::kFloat32) title += " " + dtype_name(dtype);
              const std::string what = plot::write_heatmap(
                  "--plot", args->plot,
                  toeplitz_heatmap(bias, title, head_panel_titles(options.heads)));
              if (!args->save.empty()) {
                file_argument("--save", args->save, [&] { module.save(args->save); });
              }
              out << "wrote " << args->plot << ": " << what << "\n";
              return 0;
            }
            std::optional<Tensor> result;
            if (args->table) {
              result = module.table(*args->j);
              if (dtype != DType::kFloat32) result = result->to(dtype);
            } else if (args->j) {
              result = module.forward(*args->i, *args->j, dtype);
            }
            if (!args->save.empty()) {
              file_argument("--save", args->save, [&] { module.save(args->save); });
            }
            if (result) {
              print_tensor(out, *result, args->format);
            } else {
              out << "saved " << module.parameter_names().size() << " tensors to " << args->save
                  << ":";
              for (const std::string& name : module.parameter_names()) {
                out << " " << name << " " << shape_list(module.parameter(name).shape());
              }
              out << "\n";
            }
            return 0;
          }};
}

// ---------------------------------------------------------------------- t5

Command add_t5_command(CLI::App& app) {
  struct Args {
    std::optional<std::int64_t> heads;
    std::optional<std::int64_t> i;
    std::int64_t j = 0;
    float scale = 1.0f;
    bool causal = false;
    std::int64_t num_buckets = 32;
    std::int64_t max_distance = 128;
    std::string seed = "0";
    std::string dtype = "float32";
    std::string format = "text";
    bool buckets = false;
    bool table = false;
    std::string plot;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = add_command(
      app, "t5", "The T5 relative position bias RelativePositionBias(...).forward(i, j)",
      "Shape [heads, i, j]: bias[h][r][c] = E[bucket(c - q_r)][h] * scale, the query\n"
      "of row r at q_r = j - i + r (the last i of the j keys; i > j is allowed).\n"
      "Buckets (x-transformers / T5): exact for small distances, logarithmic up to\n"
      "--max-distance, one bucket beyond; two-sided (future keys get their own\n"
      "buckets) unless --causal. The embedding E [num_buckets, heads] is N(0, 1)\n"
      "from --seed. --buckets prints the [i, j] bucket grid instead (no heads\n"
      "needed), --table the [heads, 2j - 1] distance table (of -j alone: no -i).\n"
      "Examples:\n"
      "  posbias t5 --heads 8 -i 4 -j 6 --seed 1\n"
      "  posbias t5 -i 1 -j 200 --causal --buckets");
  add_int64_option(*sub, "--heads", args->heads,
                   "Number of heads (>= 1); not needed with --buckets");
  add_int64_option(*sub, "-i", args->i, "Query length (>= 0; not with --table)");
  add_int64_option(*sub, "-j", args->j, "Key length (>= 0; >= 1 with --table)")->required();
  sub->add_option("--scale", args->scale, "Multiplies the embedding (finite)")->default_str("1");
  sub->add_flag("--causal", args->causal,
                "One-sided buckets: every future key shares bucket 0 (default: two-sided)");
  add_int64_option(*sub, "--num-buckets", args->num_buckets,
                   "Buckets (>= 2; >= 4 two-sided), default 32");
  add_int64_option(*sub, "--max-distance", args->max_distance,
                   "Distance where the last bucket starts, default 128");
  add_seed_option(*sub, args->seed, "Seed of the N(0, 1) embedding (not torch's numbers)");
  sub->add_option("--dtype", args->dtype,
                  "Output dtype: float32, bfloat16 or float16 (computed in float32, rounded once)")
      ->default_str("float32");
  add_format_option(*sub, args->format);
  CLI::Option* buckets =
      sub->add_flag("--buckets", args->buckets,
                    "Print the bucket of each query/key pair, an [i, j] grid of integers, instead "
                    "(with --format json every entry, refused when the grid as int64 exceeds "
                    "this machine's memory)");
  CLI::Option* table =
      sub->add_flag("--table", args->table,
                    "Print the distance table [heads, 2j - 1] (entry (q - c) + j - 1) instead");
  buckets->excludes(table);
  CLI::Option* plot_option = sub->add_option(
      "--plot", args->plot,
      "Draw the bias as a heatmap into FILE (.png or .svg) instead of printing it (see `posbias "
      "dpb --help`)");
  plot_option->type_name("FILE");
  plot_option->excludes(buckets)->excludes(table);

  return {
      sub, [args](std::ostream& out) {
        if (!args->plot.empty()) check_plot_path(args->plot);
        const DType dtype = parse_dtype(args->dtype);
        // As dpb: the table depends on j alone, everything else needs -i.
        if (args->table && args->i) {
          throw std::invalid_argument("-i is not used with --table (the table depends on j)");
        }
        if (!args->table) require_length(args->i, "-i", " (or --table with -j)");
        if (args->buckets) {
          const std::int64_t i = *args->i;
          const std::int64_t j = args->j;
          if (i < 0 || j < 0) {
            throw std::invalid_argument("i and j must be >= 0, got i = " + std::to_string(i) +
                                        ", j = " + std::to_string(j));
          }
          // Checks the bucket arguments even when the grid is empty.
          t5_relative_position_bucket(0, args->causal, args->num_buckets, args->max_distance);
          const auto bucket = [&](std::int64_t r, std::int64_t c) {
            // rel = key - query, the query of row r at j - i + r.
            return t5_relative_position_bucket(c - (j - i + r), args->causal, args->num_buckets,
                                               args->max_distance);
          };
          if (args->format == "json") {
            check_streamed_grid_size(i, j);
            write_int_grid_json(out, i, j, bucket);
          } else {
            out << IntGridFormatter(i, j, bucket).format() << "\n";
          }
          return 0;
        }
        require_length(args->heads, "--heads", " (or give --buckets)");
        const RelativePositionBias module(args->scale, args->causal, args->num_buckets,
                                          args->max_distance, *args->heads, parse_seed(args->seed));
        if (!args->plot.empty()) {
          plot::check_plot_size("--plot", *args->heads, *args->i, args->j);
          const ToeplitzBias bias = t5_toeplitz(module, *args->i, args->j, dtype);
          std::string title = "RelativePositionBias(heads=" + std::to_string(*args->heads) +
                              (args->causal ? ", causal" : ", two-sided") +
                              ", buckets=" + std::to_string(args->num_buckets) +
                              ", max_distance=" + std::to_string(args->max_distance) +
                              ").forward(" + std::to_string(*args->i) + ", " +
                              std::to_string(args->j) + ")";
          if (dtype != DType::kFloat32) title += " " + dtype_name(dtype);
          const std::string what = plot::write_heatmap(
              "--plot", args->plot, toeplitz_heatmap(bias, title, head_panel_titles(*args->heads)));
          out << "wrote " << args->plot << ": " << what << "\n";
          return 0;
        }
        if (args->table) {
          Tensor t = module.distance_table(args->j);
          if (dtype != DType::kFloat32) t = t.to(dtype);
          print_tensor(out, t, args->format);
        } else {
          print_tensor(out, module.forward(*args->i, args->j, dtype), args->format);
        }
        return 0;
      }};
}

// --------------------------------------------------------------- t5-bucket

Command add_t5_bucket_command(CLI::App& app) {
  struct Args {
    std::vector<std::int64_t> rel;
    bool causal = false;
    std::int64_t num_buckets = 32;
    std::int64_t max_distance = 128;
    std::string format = "text";
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = add_command(
      app, "t5-bucket", "T5 buckets of relative positions (t5_relative_position_bucket)",
      "rel = key position - query position (negative: a past key). Two-sided:\n"
      "buckets 0..nb-1 (nb = num_buckets / 2) for past keys and the query itself,\n"
      "nb..2nb-1 for future keys; causal: 0..num_buckets-1, every future key in 0.\n"
      "--format json prints {\"rel\": [...], \"buckets\": [...]}.\n"
      "Example:\n"
      "  posbias t5-bucket --rel=-200,-7,0,7 --causal");
  add_int64_list_option(*sub, "--rel", args->rel, "Relative positions k - q, comma-separated")
      ->required()
      ->type_name("R1,R2,...");
  sub->add_flag("--causal", args->causal,
                "One-sided buckets (future keys all in bucket 0); default two-sided");
  add_int64_option(*sub, "--num-buckets", args->num_buckets,
                   "Buckets (>= 2; >= 4 two-sided), default 32");
  add_int64_option(*sub, "--max-distance", args->max_distance,
                   "Distance where the last bucket starts, default 128");
  sub->add_option("--format", args->format,
                  "text: a 'rel' row over a 'bucket' row; json: {\"rel\": [...], \"buckets\": "
                  "[...]}")
      ->check(CLI::IsMember({"text", "json"}))
      ->default_str("text");

  return {sub, [args](std::ostream& out) {
            std::vector<std::int64_t> buckets;
            for (std::int64_t rel : args->rel) {
              buckets.push_back(t5_relative_position_bucket(rel, args->causal, args->num_buckets,
                                                            args->max_distance));
            }
            if (args->format == "json") {
              out << "{\"rel\": [";
              for (std::size_t k = 0; k < args->rel.size(); ++k) {
                out << (k ? ", " : "") << args->rel[k];
              }
              out << "], \"buckets\": [";
              for (std::size_t k = 0; k < buckets.size(); ++k) out << (k ? ", " : "") << buckets[k];
              out << "]}\n";
              return 0;
            }
            std::string rel_line = "rel   ";
            std::string bucket_line = "bucket";
            for (std::size_t k = 0; k < buckets.size(); ++k) {
              std::string r = std::to_string(args->rel[k]);
              std::string b = std::to_string(buckets[k]);
              const std::size_t width = std::max(r.size(), b.size());
              rel_line += "  " + std::string(width - r.size(), ' ') + r;
              bucket_line += "  " + std::string(width - b.size(), ' ') + b;
            }
            out << rel_line << "\n" << bucket_line << "\n";
            return 0;
          }};
}

}  // namespace posbias::cli
