// Helpers of the CPU reference kernels (GatedDeltaNet, GroupQueryAttention): element conversions to and
// from double, and a loop over tasks through ORT's intra-op thread pool.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/float_type.h"
#include "common/ort.h"

namespace ort_mtp {
namespace cpu {

inline double ToDouble(float v) { return v; }
inline double ToDouble(Ort::Float16_t v) { return v.ToFloat(); }
inline double ToDouble(Ort::BFloat16_t v) { return v.ToFloat(); }

// v rounded to float32, then to T: the roundings of ORT's float kernels writing a T tensor.
template <typename T>
T Round(double v);
template <>
inline float Round<float>(double v) { return static_cast<float>(v); }
template <>
inline Ort::Float16_t Round<Ort::Float16_t>(double v) { return Ort::Float16_t(static_cast<float>(v)); }
template <>
inline Ort::BFloat16_t Round<Ort::BFloat16_t>(double v) { return Ort::BFloat16_t(static_cast<float>(v)); }

template <typename T>
double Rounded(double v) { return ToDouble(Round<T>(v)); }

// The same in float32, for the fast kernels: ToFloat widens exactly, FromFloat<T> rounds to T.
inline float ToFloat(float v) { return v; }
inline float ToFloat(Ort::Float16_t v) { return v.ToFloat(); }
inline float ToFloat(Ort::BFloat16_t v) { return v.ToFloat(); }
template <typename T>
T FromFloat(float v) { return T(v); }

// fn(T{}) with T the element type of `type` (float, Ort::Float16_t, Ort::BFloat16_t): the one place the CPU
// kernels map a FloatType to the type their templates are instantiated for.
template <typename Fn>
void WithElementType(FloatType type, Fn&& fn) {
  switch (type) {
    case FloatType::kFloat32: fn(float{}); return;
    case FloatType::kFloat16: fn(Ort::Float16_t{}); return;
    case FloatType::kBFloat16: fn(Ort::BFloat16_t{}); return;
  }
}

// ORT_MTP_CPU_KERNEL=reference (read once per process) runs the double reference kernels, the tests'
// oracles, where an op has a fast CPU kernel beside one (MatMulNBits reads the variable's other values
// itself: matmul_nbits_cpu.cc).
inline bool ReferenceKernelsRequested() {
  static const bool requested = [] {
    const char* v = std::getenv("ORT_MTP_CPU_KERNEL");
    return v != nullptr && std::string(v) == "reference";
  }();
  return requested;
}

// Runs member `fn` of `kernel` for i < n, through parallel_for(context, task, n, user) when there is one
// (the ops pass Ort::KernelContext::ParallelFor); serially otherwise. Each task must write only its own
// values, so the split never changes a result.
template <typename K, void (K::*fn)(int64_t), typename ParallelFor>
void ForEach(K& kernel, int64_t n, ParallelFor parallel_for, void* context) {
  if (n <= 0) return;
  if (parallel_for == nullptr || n == 1) {
    for (int64_t i = 0; i < n; ++i) (kernel.*fn)(i);
    return;
  }
  parallel_for(
      context, [](void* user, size_t i) { (static_cast<K*>(user)->*fn)(static_cast<int64_t>(i)); },
      static_cast<size_t>(n), &kernel);
}

}  // namespace cpu
}  // namespace ort_mtp
