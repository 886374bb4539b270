#include "muon/math/cpu/gram_ns.h"

#include "muon/math/cpu/blas_tiles.h"

namespace muon {
namespace cpu {
void SymmetricTimesW(const NsProgram& program, const float* s, const float* x, float* out) {
  const int64_t m = program.m, n = program.n;
  if (program.tall) {
    TiledSsymmUpper(true, m, n, 1.0f, s, m, x, m, 0.0f, out, m);
  } else {
    TiledSsymmUpper(false, n, m, 1.0f, s, m, x, n, 0.0f, out, n);
  }
}

size_t GramWorkFloats(const NsProgram& program) {
  return static_cast<size_t>(program.x_elems + 4 * program.gram_elems);
}

}  // namespace cpu
}  // namespace muon
