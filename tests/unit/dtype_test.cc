#include "posbias/dtype.h"

#include <gtest/gtest.h>

TEST(DType, Placeholder) { EXPECT_EQ(posbias::dtype_size(posbias::DType::kFloat32), 4u); }
