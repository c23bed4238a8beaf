// Small device helpers shared by the MatMulNBits CUDA kernels: asynchronous copies into shared memory,
// ldmatrix, tensor-core mma, and the int4 -> fp16/bf16 conversion. Each is one or two PTX instructions;
// they are written out because the compiler does not form them from plain C++ (cp.async with
// zero-fill, lop3 with a chosen truth table, prmt byte shuffles).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_pdl.cuh"
#include "matmul_nbits/silu_mul.h"

namespace ort_mtp {
namespace gemv {

// What every MatMulNBits kernel takes from the problem (the fields of MatMulNBitsProblem that the
// kernels read). A, Y and M are those of one launch's token slice (LaunchSlices in
// matmul_nbits_cuda.cu). zero_points is packed uint8 or typed T, per the kernel's template; nullptr
// when absent.
struct GemvOperands {
  const void* a;            // [M, K] of T
  const uint8_t* b;         // [N, k_blocks, block_bytes] packed
  const void* scales;       // [N, k_blocks] of T
  const void* zero_points;  // see above
  const void* bias;         // [N] of T, or nullptr
  void* y;                  // [M, N] of T
  int M, N, K;
  int k_blocks;
  int zp_row_bytes;
  // 1: the second launch of a swiglu pair (MatMulNBitsCudaPair): y already holds the gate projection's
  // outputs, and each result u (rounded to T, as a node would write it) is stored as
  // T(SiluMul(gate, u)) over them (StoreResult). 0: the result itself.
  int swiglu;
};

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1 (.cg). With valid == false nothing is read and the
// 16 destination bytes are zero-filled, which is how rows past N and tokens past M are padded.
//
// No L2 cache hint (.L2::cache_hint with a createpolicy evict_first policy), although weights are read
// once: ptxas 13.0 for sm_90 mis-encodes that form. In the sm_90 code the LDGSTS names uniform
// registers as its memory descriptor (UR0/UR1 in cuobjdump's listing) that nothing in the kernel
// writes, while the policy it built sits in other registers (the sm_80 code of the same source names
// the right ones). Every call of the tensor-core kernel died with error 715, "an illegal instruction was
// encountered". The same ptxas bug is reported for Marlin (IST-DASLab/marlin#44, CUDA 13.1).
// bench/sass_lint.py checks built code for descriptors that nothing writes (docs/kernels.md#launch-and-pdl).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// 4-, 8- or 16-byte copy (the scales of one row and stage). cp.async.cg only takes 16 bytes; the
// smaller copies exist only as .ca (through L1).
template <int kBytes>
__device__ __forceinline__ void CpAsyncSmall(uint32_t dst, const void* src, bool valid) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const int src_bytes = valid ? kBytes : 0;
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(kBytes), "r"(src_bytes)
                 : "memory");
  }
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Hides a value's origin from the compiler, so that it keeps a per-thread constant (an address offset)
// in a register instead of recomputing it from threadIdx in every loop iteration (it did: ~30 extra
// instructions per chunk in the tensor-core kernel's main loop).
__device__ __forceinline__ void KeepInRegister(uint32_t& v) { asm volatile("" : "+r"(v)); }

// Four 8x8 matrices of 16-bit elements. Lanes 8i..8i+7 give the row addresses of matrix i (16 bytes
// each); lane (g = lane / 4, t = lane % 4) receives bytes [4t, 4t + 4) of row g of matrix i in d[i].
// Used on int4 weight rows it is the 4x4 word transpose among the 4 lanes of a quad that the mma
// fragment layout needs, for free.
// Not volatile, with a memory clobber: ordered with the cp.async waits and other memory accesses, but
// free to move ahead of the arithmetic before it (its latency then overlaps that work).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&d)[4], uint32_t addr) {
  asm("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(addr)
      : "memory");
}

__device__ __forceinline__ uint4 LdShared128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// Byte permute: result byte i = byte selector[i] of the 8-byte value (b:a).
__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// (a & b) | c in one instruction (truth table 0xEA); the compiler does not always find it.
__device__ __forceinline__ uint32_t AndOr(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// D = A(16x16, row) * B(16x8, col) + D, fp32 accumulators; A and B fp16 or bf16 pairs.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void Mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void Mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A * B + C with C given separately (MmaC), or C = 0 (MmaZeroC: no zeroing instructions).
#define ORT_MTP_MMA_C(TYPE)                                                                              \
  "mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, " \
  "{%10, %11, %12, %13};\n"

template <typename T>
__device__ __forceinline__ void MmaC(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                     const float (&c)[4]) {
  if constexpr (std::is_same_v<T, __half>) {
    asm(ORT_MTP_MMA_C("f16")
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
  } else {
    asm(ORT_MTP_MMA_C("bf16")
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
  }
}
#undef ORT_MTP_MMA_C

template <typename T>
__device__ __forceinline__ void MmaZeroC(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const float zero[4] = {0.f, 0.f, 0.f, 0.f};
  MmaC<T>(d, a, b0, b1, zero);
}

// int4 -> (q - z) as exact fp16/bf16 pairs. A word holds nibbles n0..n7 (n_i in bits 4i..4i+3, the
// low nibble of each byte first, i.e. 8 consecutive k). The magic-number trick ORs a nibble into the
// mantissa of a power of two (1024 for fp16, whose ulp there is 1; 128 for bf16), so one lop3 turns
// two nibbles (bits 0-3 and 16-19) into two halves at once; subtracting (magic + z) leaves q - z
// exactly (|q - z| <= 15 fits both formats). Output pairs: out[0] = (n0, n4), out[1] = (n1, n5),
// out[2] = (n2, n6), out[3] = (n3, n7), each minus z. ZeroPointConsts builds the per-z constants.
template <typename T>
struct Int4Dequant;

template <>
struct Int4Dequant<__half> {
  // sub: half2(1024 + z); nfma: half2(-(64 + z)) for the nibbles that sit 4 bits up (16 * n + 1024,
  // scaled by 1/16 in the same fma).
  struct Consts {
    uint32_t sub, nfma;
  };
  __device__ __forceinline__ static Consts Make(uint32_t z) {
    const uint32_t lo = 0x6400u | z;            // 1024 + z
    const uint32_t hi = 0xD400u + (z << 4);     // -(64 + z): 64 has ulp 1/16 in fp16
    return {lo | (lo << 16), hi | (hi << 16)};
  }
  __device__ __forceinline__ static void Run(uint32_t w, const Consts& c, uint32_t (&out)[4]) {
    constexpr uint32_t kMagic = 0x64006400u;  // half2(1024, 1024)
    constexpr uint32_t kSixteenth = 0x2C002C00u;  // half2(1/16, 1/16)
    const uint32_t w8 = w >> 8;
    const uint32_t lo0 = AndOr(w, 0x000F000Fu, kMagic);
    const uint32_t hi0 = AndOr(w, 0x00F000F0u, kMagic);
    const uint32_t lo1 = AndOr(w8, 0x000F000Fu, kMagic);
    const uint32_t hi1 = AndOr(w8, 0x00F000F0u, kMagic);
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(out[0]) : "r"(lo0), "r"(c.sub));
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(out[1]) : "r"(hi0), "r"(kSixteenth), "r"(c.nfma));
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(out[2]) : "r"(lo1), "r"(c.sub));
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(out[3]) : "r"(hi1), "r"(kSixteenth), "r"(c.nfma));
  }
};

template <>
struct Int4Dequant<__nv_bfloat16> {
  // nsub: bf16x2(-(128 + z)). bf16 has 7 mantissa bits, so 128 + n (n < 16) is exact but a nibble
  // shifted 4 bits up would reach the exponent: every nibble pair is shifted down to bits 0-3 first.
  struct Consts {
    uint32_t nsub, unused;
  };
  __device__ __forceinline__ static Consts Make(uint32_t z) {
    const uint32_t v = 0xC300u | z;  // -(128 + z)
    return {v | (v << 16), 0u};
  }
  __device__ __forceinline__ static void Run(uint32_t w, const Consts& c, uint32_t (&out)[4]) {
    constexpr uint32_t kMagic = 0x43004300u;  // bf16x2(128, 128)
    constexpr uint32_t kOne = 0x3F803F80u;    // bf16x2(1, 1)
    const uint32_t x0 = AndOr(w, 0x000F000Fu, kMagic);
    const uint32_t x1 = AndOr(w >> 4, 0x000F000Fu, kMagic);
    const uint32_t x2 = AndOr(w >> 8, 0x000F000Fu, kMagic);
    const uint32_t x3 = AndOr(w >> 12, 0x000F000Fu, kMagic);
    // x * 1 + (-(128 + z)): exact, and fma.bf16x2 exists on sm_80 where add.bf16x2 does not.
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(out[0]) : "r"(x0), "r"(kOne), "r"(c.nsub));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(out[1]) : "r"(x1), "r"(kOne), "r"(c.nsub));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(out[2]) : "r"(x2), "r"(kOne), "r"(c.nsub));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(out[3]) : "r"(x3), "r"(kOne), "r"(c.nsub));
  }
};

// Programmatic dependent launch: common/cuda_pdl.cuh.
using cuda::GridDependencyTrigger;
using cuda::GridDependencyWait;

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// A 16-bit float given by its bits (scales staged in shared memory as raw bytes).
template <typename T>
__device__ __forceinline__ float BitsToFloat(uint16_t bits) {
  static_assert(sizeof(T) == 2, "a 16-bit float type");
  T v;
  memcpy(&v, &bits, 2);
  return ToFloat<T>(v);
}


template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Stores one output of a kernel: y[i] = T(s), or with p.swiglu, T(silu(y[i]) * T(s)) (silu_mul.h: the
// CPU op's bits for the same gate and up values). Every kernel's epilogue stores through this.
template <typename T>
__device__ __forceinline__ void StoreResult(const GemvOperands& p, int64_t i, float s) {
  T* y = static_cast<T*>(p.y);
  if (p.swiglu) s = silu::SiluMul(ToFloat<T>(y[i]), ToFloat<T>(FromFloat<T>(s)));
  y[i] = FromFloat<T>(s);
}

}  // namespace gemv
}  // namespace ort_mtp
