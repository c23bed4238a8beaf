// The library's custom-op domain and the functions that add each op family to it.
#pragma once
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

}  // namespace ort_mtp
