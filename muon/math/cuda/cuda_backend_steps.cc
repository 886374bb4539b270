// The CUDA backend's element-wise step work (cuda_backend.h): momentum,
// the update, the stored scalars, split blocks' copies and scaling, the
// non-finite counts, NorMuon and the step's go-ahead, each a launch of
// ns_kernels.h or normuon_kernels.h on the backend's stream.
#include <vector>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/math/cuda/cuda_backend.h"
#include "muon/math/cuda/cuda_backend_impl.h"
#include "muon/math/cuda/normuon_kernels.h"
#include "muon/math/cuda/ns_kernels.h"

namespace muon {

absl::Status CudaBackend::StoreBytes(void* dst, const void* src, size_t bytes) {
  if (bytes > kMaxStoreBytes) {
    return absl::InternalError(absl::StrCat("StoreBytes of ", bytes, " bytes (at most ",
                                            kMaxStoreBytes, ")"));
  }
  MUON_CUDA_LAUNCH(cuda::LaunchStoreBytes(dst, src, bytes, impl_->stream), "storing bytes on the GPU");
  return absl::OkStatus();
}

absl::Status CudaBackend::Momentum(const MomentumStep& step,
                                   absl::Span<const MomentumArgs> tensors) {
  std::vector<cuda::MomentumTensor>& t = impl_->momentum_tensors;
  t.resize(tensors.size());  // grows to the largest call once, then reused
  for (size_t i = 0; i < tensors.size(); ++i) {
    const MomentumArgs& a = tensors[i];
    t[i] = {static_cast<int>(a.grad_dtype), a.grad, static_cast<int>(a.buf_dtype), a.buf, a.n,
            a.out, static_cast<int>(a.out_dtype)};
  }
  MUON_CUDA_LAUNCH(cuda::LaunchMomentum(t.data(), static_cast<int64_t>(t.size()), step.scalars,
                                 step.nesterov, step.nonfinite, impl_->stream),
            "momentum kernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::Apply(const ApplyStep& step, absl::Span<const ApplyArgs> tensors) {
  std::vector<cuda::ApplyTensor>& t = impl_->apply_tensors;
  t.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ApplyArgs& a = tensors[i];
    t[i] = {static_cast<int>(a.param_dtype), a.param, a.n, a.update, a.lr_ratio,
            static_cast<int>(a.update_dtype), a.cautious ? 1 : 0, a.weight_decay_scale};
  }
  MUON_CUDA_LAUNCH(cuda::LaunchApply(t.data(), static_cast<int64_t>(t.size()), step.scalars, step.gate,
                              impl_->stream),
            "update kernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyRuns(void* dst, size_t dst_pitch, const void* src,
                                   size_t src_pitch, size_t width, size_t height) {
  if (width == 0 || height == 0) return absl::OkStatus();
  MUON_CUDA_LAUNCH(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height,
                                     cudaMemcpyDeviceToDevice, impl_->stream),
                   "copying split blocks");
  return absl::OkStatus();
}

absl::Status CudaBackend::ScaleRounded(const MatrixBatch& batch, float factor,
                                       NsDtype precision) {
  const int to = precision == NsDtype::kBF16   ? cuda::kBF16
                 : precision == NsDtype::kFP16 ? cuda::kF16
                                               : cuda::kF32;
  MUON_CUDA_LAUNCH(cuda::LaunchScaleRounded(static_cast<int>(batch.dtype), batch.data,
                                            batch.count * batch.rows * batch.cols, factor, to,
                                            impl_->stream),
                   "scaling split blocks");
  return absl::OkStatus();
}

absl::Status CudaBackend::CountNonFinite(DType dtype, const void* data, int64_t n,
                                         int64_t* counter) {
  MUON_CUDA_LAUNCH(cuda::LaunchCountNonFinite(static_cast<int>(dtype), data, n, counter, impl_->stream),
            "counting non-finite gradients");
  return absl::OkStatus();
}

absl::Status CudaBackend::CountNonFiniteAll(absl::Span<const CountArgs> tensors,
                                            int64_t* counter) {
  std::vector<cuda::CountTensor>& t = impl_->count_tensors;
  t.resize(tensors.size());  // grows to the largest call once, then reused
  for (size_t i = 0; i < tensors.size(); ++i) {
    t[i] = {static_cast<int>(tensors[i].dtype), tensors[i].data, tensors[i].n};
  }
  MUON_CUDA_LAUNCH(cuda::LaunchCountNonFiniteAll(t.data(), static_cast<int64_t>(t.size()), counter,
                                          impl_->stream),
            "counting non-finite gradients");
  return absl::OkStatus();
}

absl::Status CudaBackend::NorMuon(const NorMuonStep& step, const MatrixBatch& batch,
                                  float* const* moments) {
  if (batch.dtype != DType::kF32 && batch.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("NorMuon takes fp32 or bf16 matrices");
  }
  if (batch.count == 0 || batch.rows <= 0 || batch.cols <= 0) return absl::OkStatus();
  const size_t rows = static_cast<size_t>(batch.count * batch.rows);
  MUON_RETURN_IF_ERROR(impl_->normuon_sums.Reserve(rows * sizeof(double), "NorMuon's row sums"));
  MUON_RETURN_IF_ERROR(
      impl_->normuon_divisors.Reserve(rows * sizeof(float), "NorMuon's row divisors"));
  const int ns_type = step.ns_dtype == NsDtype::kBF16   ? cuda::kBF16
                      : step.ns_dtype == NsDtype::kFP16 ? cuda::kF16
                                                        : cuda::kF32;
  MUON_CUDA_LAUNCH(
      cuda::LaunchNorMuon(batch.dtype == DType::kF32 ? cuda::kF32 : cuda::kBF16, batch.data,
                          batch.count, batch.rows, batch.cols, moments, step.beta2, step.eps,
                          ns_type, static_cast<double*>(impl_->normuon_sums.ptr),
                          static_cast<float*>(impl_->normuon_divisors.ptr), impl_->stream),
      "NorMuon kernels");
  return absl::OkStatus();
}

absl::Status CudaBackend::VerdictGate(const void* verdicts, int64_t n, uint32_t magic,
                                      int32_t* flag) {
  MUON_CUDA_LAUNCH(cuda::LaunchVerdictGate(verdicts, n, magic, flag, impl_->stream), "verdict kernel");
  return absl::OkStatus();
}

}  // namespace muon
