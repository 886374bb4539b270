// A row-major fp32 host matrix and its gradient, each described by a DLTensor
// (kDLCPU), filled with smooth made-up values: the parameter the C API tests
// register.
#ifndef LIBMUON_TESTS_C_API_HOST_MATRIX_H_
#define LIBMUON_TESTS_C_API_HOST_MATRIX_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "dlpack/dlpack.h"

namespace muon_test {

struct HostMatrix {
  std::vector<int64_t> shape;
  std::vector<float> value, grad;
  DLTensor v{}, g{};
  // value[i] = sin(value_rate i), grad[i] = cos(grad_rate i).
  HostMatrix(int64_t rows, int64_t cols, float value_rate = 0.1f, float grad_rate = 0.37f)
      : shape{rows, cols} {
    const size_t n = static_cast<size_t>(rows * cols);
    value.resize(n);
    grad.resize(n);
    for (size_t i = 0; i < n; ++i) {
      value[i] = std::sin(value_rate * static_cast<float>(i));
      grad[i] = std::cos(grad_rate * static_cast<float>(i));
    }
    for (DLTensor* t : {&v, &g}) {
      t->device = {kDLCPU, 0};
      t->ndim = 2;
      t->dtype = DLDataType{kDLFloat, 32, 1};
      t->shape = shape.data();
    }
    v.data = value.data();
    g.data = grad.data();
  }
  HostMatrix(const HostMatrix&) = delete;
  HostMatrix& operator=(const HostMatrix&) = delete;
};

}  // namespace muon_test

#endif  // LIBMUON_TESTS_C_API_HOST_MATRIX_H_
