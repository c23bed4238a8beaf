// What the two CPU kernels of GatedDeltaNet share (gated_delta_net_cpu.cc, the double reference, and
// gated_delta_net_cpu_fast.cc): reading the small per-head parameters, zeroing the window slots before a
// call's first token, and writing the conv state slots (copies, so both kernels write the same bytes).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/cpu_numeric.h"
#include "gated_delta_net/gated_delta_net.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ort_mtp {
namespace gdn_cpu {

// Element i of a small parameter vector whose type is known only at run time (dt_bias, neg_exp_A).
inline double LoadAny(const void* p, FloatType type, int64_t i) {
  switch (type) {
    case FloatType::kFloat32: return static_cast<const float*>(p)[i];
    case FloatType::kFloat16: return cpu::ToDouble(static_cast<const Ort::Float16_t*>(p)[i]);
    case FloatType::kBFloat16: return cpu::ToDouble(static_cast<const Ort::BFloat16_t*>(p)[i]);
  }
  return 0.0;
}

// Zeros over `bytes` at p with non-temporal stores where the CPU has them (SSE2: every x86-64): a window's
// slots before a call's first token are zeroed on every call, a slot of a layer's state at a time, and
// nothing reads them back soon, so they need not pass through the cache (nor be read into it first).
inline void ZeroSlot(void* p, size_t bytes) {
#if defined(__x86_64__)
  auto* c = static_cast<char*>(p);
  const size_t lead = std::min(bytes, static_cast<size_t>((16 - reinterpret_cast<uintptr_t>(c) % 16) % 16));
  std::memset(c, 0, lead);
  c += lead;
  bytes -= lead;
  const __m128i zero = _mm_setzero_si128();
  for (; bytes >= 16; bytes -= 16, c += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(c), zero);
  std::memset(c, 0, bytes);
  _mm_sfence();  // the streamed stores are ordered before whatever reads the slots next
#else
  std::memset(p, 0, bytes);
#endif
}

// The present conv state slots of batch b: slot j holds the last K - 1 inputs up to token S - slots + j
// (zeros before the call's first token). Reads its past first, so that present may alias past; run it
// only once every task has read the past conv state.
template <typename T>
void ConvStates(const GatedDeltaNetProblem& p, int64_t b) {
  const int64_t C = p.conv_dim(), L = p.conv_state_len(), B = p.batch;
  const T* past = static_cast<const T*>(p.past_conv) + b * C * L;
  const std::vector<T> past_copy(past, past + C * L);
  const T* qkv = static_cast<const T*>(p.qkv) + b * p.seq * C;
  for (int64_t slot = 0; slot < p.slots; ++slot) {
    T* out = static_cast<T*>(p.present_conv) + (slot * B + b) * C * L;
    const int64_t t = p.seq - p.slots + slot;  // the last token this slot has seen
    if (t < 0) {
      ZeroSlot(out, sizeof(T) * C * L);  // before this call's first token
      continue;
    }
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t s = 0; s < L; ++s) {
        const int64_t pos = t - (L - 1) + s;  // token held at state position s
        out[c * L + s] = pos >= 0 ? qkv[pos * C + c] : past_copy[c * L + (L + pos)];
      }
    }
  }
}

}  // namespace gdn_cpu
}  // namespace ort_mtp
