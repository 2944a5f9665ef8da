#include "posbias/version.h"

namespace posbias {

const char* version() { return POSBIAS_VERSION_STRING; }

}  // namespace posbias
