// SwiGLU's activation as MatMulNBits defines it (activation="swiglu"): y = silu(g) * u in float32,
// silu(g) = g / (1 + e), e = exp(-g) by one fixed sequence of operations, so that the CPU kernels (the
// scalar loop and the AVX2 one in matmul_nbits_cpu.cc) and the CUDA kernels (the epilogue of
// gemv_stream.cuh and gemv_generic.cuh) give the same bits for the same g and u:
//   x = min(max(-g, -87), 88)          (keeps 2^n a normal float; a NaN g gives x = -87, y stays NaN)
//   n = (fma(x, log2(e), 1.5 * 2^23) - 1.5 * 2^23)     (x / ln 2 rounded to nearest even)
//   r = fma(n, -ln2_lo, fma(n, -ln2_hi, x))           (Cody and Waite's two-part ln 2)
//   p = Horner over Cephes' expf coefficients c0..c5 in r (fma), e = (fma(p, r * r, r) + 1) * 2^n
//   y = g / (1 + e) * u
// About 1 ulp from expf on e (the tests hold the output within 4 ulps of numpy's exp-based result).
// Every step is an explicit fma or a single IEEE operation (no a * b + c for a compiler to contract,
// and CUDA's default division is correctly rounded), which is what makes the bits the same everywhere.
// Why not the C library's expf: it is a scalar call per element, and the CPU epilogue runs it M x N
// times per node, where the AVX2 loop does 8 elements per iteration.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define ORT_MTP_SILU_HD __host__ __device__
#else
#define ORT_MTP_SILU_HD
#endif

namespace ort_mtp {
namespace silu {

constexpr float kExpLo = -87.0f, kExpHi = 88.0f, kLog2e = 1.44269504088896341f, kRound = 12582912.0f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpC0 = 1.9875691500e-4f, kExpC1 = 1.3981999507e-3f, kExpC2 = 8.3334519073e-3f,
                kExpC3 = 4.1665795894e-2f, kExpC4 = 1.6666665459e-1f, kExpC5 = 5.0000001201e-1f;

ORT_MTP_SILU_HD inline float TwoPow(float n) {  // 2^n for an integral n in [-126, 127]
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// e^x by the sequence above, x first clamped to [-87, 88] (a NaN x gives e^-87): about 1 ulp from
// expf inside that range. Also the CPU GatedDeltaNet's exp (its SiLU, gates and decay), for the same
// reason: one vectorisable sequence instead of a scalar library call per element.
ORT_MTP_SILU_HD inline float Exp(float x) {
  x = x > kExpLo ? x : kExpLo;  // as _mm256_max_ps(x, lo): lo when x is NaN
  x = x < kExpHi ? x : kExpHi;
  const float n = fmaf(x, kLog2e, kRound) - kRound;
  const float r = fmaf(n, -kLn2Lo, fmaf(n, -kLn2Hi, x));
  float q = kExpC0;
  q = fmaf(q, r, kExpC1);
  q = fmaf(q, r, kExpC2);
  q = fmaf(q, r, kExpC3);
  q = fmaf(q, r, kExpC4);
  q = fmaf(q, r, kExpC5);
  return (fmaf(q, r * r, r) + 1.0f) * TwoPow(n);
}

ORT_MTP_SILU_HD inline float SiluMul(float g, float u) { return g / (1.0f + Exp(-g)) * u; }

}  // namespace silu
}  // namespace ort_mtp
