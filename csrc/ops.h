// The library's custom-op domain and the functions that add each op family to it.
#pragma once
#include <cstdlib>
#include <string>

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

// The classes of an op family templated on <FloatType, bool cuda> for float32, float16 and bfloat16 on
// one EP. They are static: the domain holds pointers to them for the process's life.
template <template <FloatType, bool> class Op, bool kCuda>
void AddThreeTypes(Ort::CustomOpDomain& domain) {
  static Op<FloatType::kFloat32, kCuda> f32;
  static Op<FloatType::kFloat16, kCuda> f16;
  static Op<FloatType::kBFloat16, kCuda> bf16;
  domain.Add(&f32);
  domain.Add(&f16);
  domain.Add(&bf16);
}

// Adds an op family: its CPU classes, and its CUDA classes too when `cuda` (in a CUDA build).
template <template <FloatType, bool> class Op>
void AddFloatTypedOps(Ort::CustomOpDomain& domain, bool cuda) {
  AddThreeTypes<Op, false>(domain);
#ifdef ORT_MTP_WITH_CUDA
  if (cuda) AddThreeTypes<Op, true>(domain);
#else
  (void)cuda;
#endif
}

// Whether an op's CUDA kernel is registered, by the environment switch `name` ("1" or "0", read when the
// library is registered): `fallback` when unset or anything else. The switches leave a kernel out (its
// models then keep ORT's nodes: the rewrites ask the library which kernels it has) or, for one that has
// not run on a GPU yet, put it in.
inline bool CudaKernelSwitch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v != nullptr && std::string(v) == "0") return false;
  if (v != nullptr && std::string(v) == "1") return true;
  return fallback;
}

}  // namespace ort_mtp
