// The library's custom-op domain and the functions that add each op family to it.
#pragma once
#include "common/float_type.h"
#include "common/ort.h"

namespace ort_mtp {

// Every op of this library lives in this domain (documented in README.md).
constexpr const char* kDomain = "ort_mtp";

void AddMatMulNBitsOps(Ort::CustomOpDomain& domain, bool with_cuda);
void AddCopySlotsOps(Ort::CustomOpDomain& domain, bool with_cuda);
void AddGatedDeltaNetOps(Ort::CustomOpDomain& domain, bool with_cuda);
void AddGroupQueryAttentionOps(Ort::CustomOpDomain& domain, bool with_cuda);
void AddFloatMatMulOps(Ort::CustomOpDomain& domain, bool with_cuda);
void AddGatedAttentionOps(Ort::CustomOpDomain& domain, bool with_cuda);
void AddSkipNormOps(Ort::CustomOpDomain& domain, bool with_cuda);

// Adds an op family templated on <FloatType, bool cuda>: its CPU classes for float32, float16 and
// bfloat16, and its CUDA classes too when `cuda` (in a CUDA build). The classes are static: the domain
// holds pointers to them for the process's life.
template <template <FloatType, bool> class Op>
void AddFloatTypedOps(Ort::CustomOpDomain& domain, bool cuda) {
  static Op<FloatType::kFloat32, false> cpu_f32;
  static Op<FloatType::kFloat16, false> cpu_f16;
  static Op<FloatType::kBFloat16, false> cpu_bf16;
  domain.Add(&cpu_f32);
  domain.Add(&cpu_f16);
  domain.Add(&cpu_bf16);
#ifdef ORT_MTP_WITH_CUDA
  if (cuda) {
    static Op<FloatType::kFloat32, true> cuda_f32;
    static Op<FloatType::kFloat16, true> cuda_f16;
    static Op<FloatType::kBFloat16, true> cuda_bf16;
    domain.Add(&cuda_f32);
    domain.Add(&cuda_f16);
    domain.Add(&cuda_bf16);
  }
#else
  (void)cuda;
#endif
}

}  // namespace ort_mtp
