// The safetensors format (see safetensors_format.h): what the bytes mean.
//
// The reader trusts nothing in the file: the header length is bounded by the
// file and by a fixed cap before anything is allocated, the JSON is parsed
// with a depth limit and duplicate-key detection, every entry is checked
// against the exact layout, sizes are computed with overflow checks, and the
// data buffer must be covered exactly once (no gaps, no overlaps, no trailing
// bytes) -- the same rules as the reference implementation (Hugging Face's
// Rust `safetensors` crate), so that a file accepted here loads there too.
//
// The writer produces the layout of the reference writer: compact JSON
// (__metadata__ first, then the tensors), padded with spaces to a multiple of
// 8 bytes so that the data starts 8-byte aligned, then the tensors' bytes in
// header order.
#include "safetensors_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "checks.h"

namespace posbias::detail {
namespace {

using json = nlohmann::json;

constexpr bool kHostLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// Element types as safetensors names them, with what they load as.
constexpr StoredType kLoadable[] = {
    {"F32", 4, DType::kFloat32},
    {"F16", 2, DType::kFloat16},
    {"BF16", 2, DType::kBFloat16},
    {"F64", 8, DType::kFloat32},  // converted, rounded once
};
// The other dtypes of the format: recognised (so the message can say "not
// supported" rather than "unknown"), never loaded.
constexpr const char* kKnownUnsupported[] = {
    "BOOL", "U8",      "I8",      "I16",     "U16",     "I32",     "U32", "I64",
    "U64",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",  "C64"};

const char* stored_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat16:
      return "F16";
    case DType::kFloat64:
    case DType::kInt32:
    case DType::kUInt8:
    case DType::kBool:
      detail::unsupported_dtype("safetensors", dtype);
  }
  return "F32";
}

[[noreturn]] void fail(const std::string& what, const std::string& msg) {
  throw std::invalid_argument("safetensors " + what + ": " + msg);
}

[[noreturn]] void fail_tensor(const std::string& what, const std::string& name,
                              const std::string& msg) {
  fail(what, "tensor " + quoted_name(name) + ": " + msg);
}

std::string type_of(const json& v) {
  if (v.is_number_unsigned() || v.is_number_integer()) return "integer " + v.dump();
  if (v.is_number_float()) return "number " + v.dump();
  std::string dumped = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (dumped.size() > 60) dumped = dumped.substr(0, 57) + "...";
  return std::string(v.type_name()) + " " + dumped;
}

std::uint64_t read_u64_le(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

// Reverses the bytes of each `size`-byte element (big-endian hosts only).
void swap_elements(void* data, std::size_t count, std::size_t size) {
  auto* p = static_cast<unsigned char*>(data);
  for (std::size_t e = 0; e < count; ++e, p += size) std::reverse(p, p + size);
}

// Thrown from the parser callback; turned into a message with context.
struct HeaderShapeError {
  std::string msg;
};

json parse_header_json(std::string_view header, const std::string& what) {
  // The layout needs objects at depths 0 and 1 and arrays at depth 2. Deeper
  // nesting is rejected while parsing, which also bounds the memory a hostile
  // header ("[[[[...") can make the parser allocate.
  std::vector<std::set<std::string>> keys;  // per open object
  std::string current_tensor;
  const auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth > 2) {
          throw HeaderShapeError{(current_tensor.empty() ? std::string("header")
                                                         : "tensor " + quoted_name(current_tensor)) +
                                 ": JSON nested deeper than the safetensors layout allows"};
        }
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (depth == 1) current_tensor = key;
        if (!keys.empty() && !keys.back().insert(key).second) {
          throw HeaderShapeError{
              (depth == 1 ? std::string("header") : "tensor " + quoted_name(current_tensor)) +
              ": duplicate key " + quoted_name(key)};
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(header.begin(), header.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const HeaderShapeError& e) {
    fail(what, e.msg);
  } catch (const json::exception& e) {
    // The parser quotes what it last read: keep the message printable.
    std::string reason = e.what();
    for (char& ch : reason) {
      const auto u = static_cast<unsigned char>(ch);
      if (u < 0x20 || u >= 0x7F) ch = '?';
    }
    fail(what, "header is not valid JSON (" + reason + ")");
  }
}

// A non-negative integer JSON value, or nullopt-like failure via `ok`.
bool as_u64(const json& v, std::uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<std::uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    const auto s = v.get<std::int64_t>();
    if (s < 0) return false;
    *out = static_cast<std::uint64_t>(s);
    return true;
  }
  return false;
}

Entry parse_entry(const std::string& name, const json& v, std::uint64_t buffer_size,
                  const std::string& what) {
  if (!v.is_object()) {
    fail_tensor(what, name,
                "expected an object with dtype, shape and data_offsets, found " + type_of(v));
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(key)) {
      fail_tensor(
          what, name,
          std::string("missing key \"") + key + "\" (expected exactly dtype, shape, data_offsets)");
    }
  }
  for (const auto& item : v.items()) {
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets") {
      fail_tensor(what, name,
                  "unexpected key " + quoted_name(item.key()) +
                      " (expected exactly dtype, shape, data_offsets)");
    }
  }
  Entry e;
  e.name = name;

  const json& dtype = v["dtype"];
  if (!dtype.is_string()) {
    fail_tensor(what, name, "dtype must be a string, found " + type_of(dtype));
  }
  const std::string& dname = dtype.get_ref<const std::string&>();
  for (const StoredType& t : kLoadable) {
    if (dname == t.name) e.type = &t;
  }
  if (e.type == nullptr) {
    const bool known = std::any_of(std::begin(kKnownUnsupported), std::end(kKnownUnsupported),
                                   [&](const char* k) { return dname == k; });
    fail_tensor(what, name,
                std::string(known ? "dtype " : "unknown dtype ") + quoted_name(dname) +
                    (known ? " is not supported" : "") + " (expected F32, F16, BF16 or F64)");
  }

  const json& shape = v["shape"];
  if (!shape.is_array()) {
    fail_tensor(what, name, "shape must be an array of integers, found " + type_of(shape));
  }
  std::uint64_t numel = 1;
  bool overflow = false;
  for (const json& extent : shape) {
    std::uint64_t x = 0;
    if (!as_u64(extent, &x) ||
        x > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail_tensor(what, name,
                  "shape " + shape.dump() + ": every extent must be an integer >= 0, found " +
                      type_of(extent));
    }
    e.shape.push_back(static_cast<std::int64_t>(x));
    if (!overflow && __builtin_mul_overflow(numel, x, &numel)) overflow = true;
  }
  const bool empty = std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end();
  std::uint64_t nbytes = 0;
  if (empty) {
    numel = 0;
  } else if (overflow ||
             numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
             __builtin_mul_overflow(numel, e.type->size, &nbytes)) {
    fail_tensor(what, name,
                "shape " + detail::shape_string(e.shape) +
                    " has too many elements (the byte size overflows)");
  }

  const json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !as_u64(offsets[0], &e.begin) ||
      !as_u64(offsets[1], &e.end)) {
    fail_tensor(what, name,
                "data_offsets must be [begin, end] with integers >= 0, found " + type_of(offsets));
  }
  if (e.begin > e.end) {
    fail_tensor(what, name,
                "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                    "] have begin > end");
  }
  if (e.end > buffer_size) {
    fail_tensor(what, name,
                "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                    "] are out of range: the data buffer "
                    "holds " +
                    std::to_string(buffer_size) + " bytes (truncated file, or corrupted offsets)");
  }
  if (e.end - e.begin != nbytes) {
    fail_tensor(what, name,
                "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                    "] hold " + std::to_string(e.end - e.begin) + " bytes, but " + dname + " x " +
                    detail::shape_string(e.shape) + " needs " + std::to_string(nbytes));
  }
  return e;
}

void check_metadata(const json& v, const std::string& what) {
  if (!v.is_object()) {
    fail(what, "__metadata__ must be an object of strings, found " + type_of(v));
  }
  for (const auto& item : v.items()) {
    if (!item.value().is_string()) {
      fail(what, "__metadata__ entry " + quoted_name(item.key()) + " must be a string, found " +
                     type_of(item.value()));
    }
  }
}

std::string json_string(const std::string& s, const std::string& what) {
  try {
    return json(s).dump();  // strict: invalid UTF-8 throws
  } catch (const json::exception&) {
    throw std::invalid_argument("save_safetensors: " + what + " " + quoted_name(s) +
                                " is not valid UTF-8");
  }
}

}  // namespace

void check_total_size(std::uint64_t total, const std::string& what) {
  if (total < 8) {
    fail(what, "truncated: " + std::to_string(total) +
                   " bytes, expected at least 8 (the little-endian header length)");
  }
}

std::uint64_t check_prefix(const unsigned char* first8, std::uint64_t total,
                           const std::string& what) {
  const std::uint64_t n = read_u64_le(first8);
  if (n > kMaxHeaderBytes) {
    fail(what, "header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) +
                   " bytes (corrupted length, or not a safetensors file)");
  }
  if (n > total - 8) {
    fail(what, "truncated: the header claims " + std::to_string(n) + " bytes but only " +
                   std::to_string(total - 8) + " bytes follow the 8-byte length");
  }
  if (n < 2) {
    fail(what, "header length " + std::to_string(n) +
                   " is too short for a JSON object (expected at least 2 bytes)");
  }
  return n;
}

std::vector<Entry> parse_header(std::string_view header, std::uint64_t buffer_size,
                                const std::string& what) {
  const json root = parse_header_json(header, what);
  if (!root.is_object()) {
    fail(what, "header must be a JSON object, found " + type_of(root));
  }
  std::vector<Entry> entries;
  for (const auto& item : root.items()) {
    if (item.key() == "__metadata__") {
      check_metadata(item.value(), what);
      continue;
    }
    entries.push_back(parse_entry(item.key(), item.value(), buffer_size, what));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered) {
      fail(what, "tensors " + quoted_name(previous->name) + " [" + std::to_string(previous->begin) +
                     ", " + std::to_string(previous->end) + ") and " + quoted_name(e.name) + " [" +
                     std::to_string(e.begin) + ", " + std::to_string(e.end) + ") overlap");
    }
    if (e.begin > covered) {
      fail(what, "gap in the data buffer: bytes [" + std::to_string(covered) + ", " +
                     std::to_string(e.begin) + ") before tensor " + quoted_name(e.name) +
                     " belong to no tensor");
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != buffer_size) {
    fail(what, "oversized: the tensors cover " + std::to_string(covered) +
                   " bytes of the data buffer but it holds " + std::to_string(buffer_size) + " (" +
                   std::to_string(buffer_size - covered) + " trailing bytes)");
  }
  return entries;
}

std::uint64_t claimed_data_bytes(std::string_view header) {
  // Only the entries' data_offsets are kept (depth <= 3): a deeply nested
  // header is dropped while it is parsed, never built.
  const json root = json::parse(
      header.begin(), header.end(),
      [](int depth, json::parse_event_t, json&) { return depth <= 3; },
      /*allow_exceptions=*/false);
  std::uint64_t end = 0;
  if (!root.is_object()) return 0;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (!it.value().is_object()) continue;
    const auto offsets = it.value().find("data_offsets");
    if (offsets == it.value().end() || !offsets->is_array() || offsets->size() != 2) continue;
    const json& last = (*offsets)[1];
    if (last.is_number_unsigned()) end = std::max(end, last.get<std::uint64_t>());
  }
  return end;
}

Tensor load_entry(const Entry& e, const std::string& what, const ReadData& read) {
  Tensor t = Tensor::empty(e.shape, e.type->dtype);
  const auto count = static_cast<std::size_t>(t.numel());
  if (count == 0) return t;
  if (e.type->size == dtype_size(e.type->dtype)) {
    read(t.raw_mutable_data(), e.begin, e.end - e.begin);
    if (!kHostLittleEndian) swap_elements(t.raw_mutable_data(), count, e.type->size);
    return t;
  }
  // F64 -> float32, rounded once (to nearest even, as static_cast does).
  std::vector<double> wide(count);
  read(wide.data(), e.begin, e.end - e.begin);
  if (!kHostLittleEndian) swap_elements(wide.data(), count, sizeof(double));
  float* out = t.mutable_data<float>();
  for (std::size_t k = 0; k < count; ++k) {
    out[k] = static_cast<float>(wide[k]);
    // A finite value beyond float32's range would become inf here and be
    // reported later as a non-finite parameter, though the file's value was
    // finite: say what happened, where. (inf and NaN stay as they are.)
    if (std::isinf(out[k]) && std::isfinite(wide[k])) {
      std::vector<std::int64_t> index(e.shape.size());
      std::uint64_t rest = k;
      for (std::size_t d = e.shape.size(); d-- > 0;) {
        const auto extent = static_cast<std::uint64_t>(e.shape[d]);
        index[d] = static_cast<std::int64_t>(rest % extent);
        rest /= extent;
      }
      char value[32];
      const auto written = std::to_chars(value, value + sizeof(value), wide[k]);
      fail_tensor(what, e.name,
                  "F64 element " + detail::shape_string(index) + " = " +
                      std::string(value, written.ptr) +
                      " overflows float32 (F64 tensors are rounded to float32 at load)");
    }
  }
  return t;
}

std::string build_header(const TensorMap& tensors,
                         const std::map<std::string, std::string>& metadata,
                         std::vector<Planned>* plan) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) h += ",";
      first = false;
      h += json_string(key, "metadata key") + ":" + json_string(value, "metadata value");
    }
    h += "}";
  }
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") {
      throw std::invalid_argument(
          "save_safetensors: \"__metadata__\" is reserved and cannot name a tensor");
    }
    const std::uint64_t bytes = static_cast<std::uint64_t>(t.numel()) * dtype_size(t.dtype());
    if (h.size() > 1) h += ",";
    h += json_string(name, "tensor name") + ":{\"dtype\":\"" + stored_name(t.dtype()) +
         "\",\"shape\":[";
    for (std::size_t d = 0; d < t.shape().size(); ++d) {
      if (d) h += ",";
      h += std::to_string(t.shape()[d]);
    }
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) +
         "]}";
    offset += bytes;
    plan->push_back(Planned{&name, &t, bytes});
  }
  h += "}";
  // Pad with spaces (valid JSON whitespace) so the data starts 8-aligned.
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

void write_u64_le(std::uint64_t v, char* p) {
  for (int k = 0; k < 8; ++k) p[k] = static_cast<char>((v >> (8 * k)) & 0xFFu);
}

void emit_data(const std::vector<Planned>& plan,
               const std::function<void(const void* data, std::size_t bytes)>& emit) {
  for (const Planned& p : plan) {
    if (p.bytes == 0) continue;
    const Tensor& t = *p.tensor;
    if (kHostLittleEndian && t.is_contiguous()) {
      emit(t.raw_data(), static_cast<std::size_t>(p.bytes));
      continue;
    }
    Tensor copy = t.contiguous_copy();
    if (!kHostLittleEndian) {
      swap_elements(copy.raw_mutable_data(), static_cast<std::size_t>(copy.numel()),
                    dtype_size(copy.dtype()));
    }
    emit(copy.raw_data(), static_cast<std::size_t>(p.bytes));
  }
}

}  // namespace posbias::detail
