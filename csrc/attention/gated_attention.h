// GatedAttention: the CUDA kernel's problem (gated_attention.cc has the op and its definition; the CPU
// kernel lives there too). The launcher makes the query, key and value in a per-stream scratch and
// hands them to GroupQueryAttentionCuda through `gqa`.
#pragma once
#include <cstdint>

#include "attention/group_query_attention.h"

namespace ort_mtp {

struct GatedAttentionProblem {
  GroupQueryAttentionProblem gqa;       // everything but query, key and value (the launcher's scratch)
  const void* qkv = nullptr;            // [B, S, 2 (Nq + Nkv) H] of gqa.type
  const int64_t* position_ids = nullptr;  // [3, B, S] on the device
  const float* cos_cache = nullptr;     // [max_position, rotary_dim / 2]
  const float* sin_cache = nullptr;
  const void* q_norm_weight = nullptr;  // [H] of gqa.type
  const void* k_norm_weight = nullptr;
  int64_t rotary_dim = 0;               // even, <= H (the op resolved 0 to H)
  int64_t max_position = 0;
  int64_t mrope_section[3] = {0, 0, 0};
  int mrope_layout = 0;
  float epsilon = 0.f;
};

#ifdef ORT_MTP_WITH_CUDA
// Three launches on `stream` (prepare q, k, v; GroupQueryAttentionCuda; the gate), no host
// synchronisation, no allocation once the stream's scratch has grown (StreamScratch), so capturable in
// a CUDA graph. position_ids are read on the device: a token whose position falls outside the cos/sin
// caches gets NaN query and key rows (so NaN outputs), nothing is read out of bounds. Returns nullptr on
// success, else what failed.
const char* GatedAttentionCuda(GatedAttentionProblem p, void* stream);
#endif

}  // namespace ort_mtp
