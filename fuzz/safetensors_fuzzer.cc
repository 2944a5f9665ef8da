// Fuzzes the safetensors reader: parse_safetensors() on arbitrary bytes must
// either return tensors or throw std::invalid_argument (the documented error
// of every malformed file; std::length_error for a size past memory) and
// never crash, read out of bounds, leak or allocate more than the bytes hold.
// What it parses must survive a round trip: serialize_safetensors() of the
// result parses back to the same shapes, dtypes and bits.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "posbias/safetensors.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& name) {
  std::fprintf(stderr, "safetensors fuzzer: %s (tensor '%s')\n", what, name.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  posbias::TensorMap tensors;
  try {
    tensors = posbias::parse_safetensors(bytes, "fuzz input");
  } catch (const std::invalid_argument& e) {
    if (std::strncmp(e.what(), "safetensors fuzz input: ", 24) != 0) {
      fail("error message does not name the input", e.what());
    }
    return 0;
  } catch (const std::length_error&) {
    return 0;
  }
  // Everything parsed holds no more bytes than the input.
  std::size_t total = 0;
  for (const auto& [name, t] : tensors) {
    total += static_cast<std::size_t>(t.numel()) * posbias::dtype_size(t.dtype());
  }
  if (total > size) fail("parsed tensors hold more bytes than the input", "");
  const std::string again = posbias::serialize_safetensors(tensors);
  const posbias::TensorMap back = posbias::parse_safetensors(again, "round trip");
  if (back.size() != tensors.size()) fail("round trip changed the tensor count", "");
  for (const auto& [name, t] : tensors) {
    const auto it = back.find(name);
    if (it == back.end()) fail("round trip lost a tensor", name);
    const posbias::Tensor& u = it->second;
    if (u.shape() != t.shape() || u.dtype() != t.dtype()) {
      fail("round trip changed shape or dtype", name);
    }
    const std::size_t n = static_cast<std::size_t>(t.numel()) * posbias::dtype_size(t.dtype());
    if (n != 0 && std::memcmp(u.raw_data(), t.raw_data(), n) != 0) {
      fail("round trip changed the bits", name);
    }
  }
  return 0;
}
