// Internal: what a DynamicPositionBias's parameters are (names, shapes, kinds,
// in state-dict order) and the checks of its options, shared by the module
// (dpb.cc) and its float64 reference (dpb_reference.cc).
#ifndef POSBIAS_SRC_DPB_PARAMS_H_
#define POSBIAS_SRC_DPB_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "posbias/dpb.h"

namespace posbias::detail {

enum class DpbParamKind : std::uint8_t { kLinearWeight, kLinearBias, kNormWeight, kNormBias };

struct DpbParamSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  DpbParamKind kind;
  std::int64_t fan_in;  // Linear only
};

// std::invalid_argument naming the option, as the constructor throws.
void dpb_check_options(const DpbOptions& o);

// The parameters in module (state-dict) order.
std::vector<DpbParamSpec> dpb_param_specs(const DpbOptions& o);

// Appends p (a parameter's or its gradient's values) to the list of `view`
// its kind belongs to: View has the vectors weight, bias, ln_weight and
// ln_bias (the kernels' DpbMlp and DpbMlpGrads, the float64 reference's).
template <typename View, typename P>
void dpb_add_to_view(View& view, DpbParamKind kind, P* p) {
  switch (kind) {
    case DpbParamKind::kLinearWeight:
      view.weight.push_back(p);
      break;
    case DpbParamKind::kLinearBias:
      view.bias.push_back(p);
      break;
    case DpbParamKind::kNormWeight:
      view.ln_weight.push_back(p);
      break;
    case DpbParamKind::kNormBias:
      view.ln_bias.push_back(p);
      break;
  }
}

}  // namespace posbias::detail

#endif  // POSBIAS_SRC_DPB_PARAMS_H_
