// posbias: positional biases for attention (ALiBi, Dynamic Position Bias,
// T5 relative buckets), exact against the PyTorch references and written at
// memory speed.
//
//   #include <posbias/posbias.h>
//
//   posbias::AlibiPositionalBias alibi(/*heads=*/4, /*total_heads=*/8);
//   posbias::Tensor bias = alibi.forward(/*i=*/10, /*j=*/10);  // [8, 10, 10]
//   std::cout << posbias::format_tensor(bias) << "\n";
//
// Link with the CMake target posbias::posbias (find_package(posbias CONFIG)
// or add_subdirectory), or with pkg-config's `posbias`.
#ifndef POSBIAS_POSBIAS_H_
#define POSBIAS_POSBIAS_H_

#include "posbias/alibi.h"
#include "posbias/attention.h"
#include "posbias/distance_table.h"
#include "posbias/dpb.h"
#include "posbias/dtype.h"
#include "posbias/limits.h"
#include "posbias/safetensors.h"
#include "posbias/slopes.h"
#include "posbias/t5.h"
#include "posbias/tensor.h"
#include "posbias/version.h"

#endif  // POSBIAS_POSBIAS_H_
