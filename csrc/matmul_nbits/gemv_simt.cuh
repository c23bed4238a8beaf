// A CUDA-core MatMulNBits kernel, run only with ORT_MTP_GEMV_VARIANT=simt: no tensor cores, no cp.async
// pipeline, no inline PTX beyond the int4 conversion the tensor-core kernels also use. The default
// dispatch never picks it, and no supported GPU needs it: on sm_80 and sm_90 (and newer GPUs through
// PTX) every problem the tensor-core kernels take (K a multiple of their chunk, aligned buffers) goes
// to them and the rest to the general kernel. It was the fallback kept in case the tensor-core design
// failed on the device; it stays while the GPU checks test it (groups smoke-simt and decode-simt).
//
// Takes: fp16/bf16, 4 bits, block size 32..256 (power of two), no or packed zero points, K a multiple of
// 32, 16-byte aligned A and B. Everything else goes to the general kernel.
//
// Work split: a block of kSimtWarps warps owns kSimtRows output features (rows of B) and a group of
// kTok tokens (grid.y). The K axis is cut into 32-value chunks (16 bytes of one weight row, inside one
// quant block); chunk c goes to lane c % 32 of warp (c / 32) % kSimtWarps, so each warp reads 512
// contiguous bytes of each of its rows per step. A lane loads its chunk of all kSimtRows rows (four
// independent 16-byte loads in flight), turns each weight into (q - z) as an exact fp32 value, and then,
// for every token, loads the
// chunk's activations (16 bytes per 8 values, from L1/L2: A is small and every block rereads it),
// sums a * (q - z) over the chunk with fmaf and adds scale * sum to the token's accumulator. Each
// weight load thus serves every token of the pass.
//
// Arithmetic of one (row, token) result, fixed whatever M is: per lane and chunk, fmaf of a * (q - z)
// over the k order 0,4,1,5,2,6,3,7 of each 8-value word (the order Int4Dequant hands out the values),
// words in order; acc = fmaf(scale, chunk sum, acc) over the lane's chunks in ascending order; the 32
// lanes meet in a fixed xor butterfly; the warps'
// sums are added in warp order; then bias; one rounding. kTok (chosen from M) only decides which
// tokens share a pass, so row i of an M-row call is bit-identical to the M = 1 call on row i.
//
// Cost: per weight ~1.2 instructions to (q - z) (lop3 + f16x2 sub/fma per pair), 1
// conversion to fp32, then 1 fmaf per token: ~3.5 issue slots per weight at M = 1 (bandwidth-bound on
// an H200, narrowly), ~2.5 + M beyond, so M >= 3 is bound by the FMA rate, not by HBM.
#pragma once
#include "matmul_nbits/gemv_ptx.cuh"

namespace ort_mtp {
namespace gemv {

struct SimtParams : GemvOperands {  // zero_points: packed int4, or nullptr
  int64_t row_bytes;  // bytes of one row of B (k_blocks * block_size / 2)
  int chunk_shift;    // log2(block_size / 32): quant block of chunk c is c >> chunk_shift
};

constexpr int kSimtRows = 4;   // output features per block
constexpr int kSimtWarps = 4;  // warps per block, splitting K

template <typename T>
__device__ __forceinline__ float2 PairToFloat2(uint32_t pair);
template <>
__device__ __forceinline__ float2 PairToFloat2<__half>(uint32_t pair) {
  __half2 h;
  memcpy(&h, &pair, 4);
  return __half22float2(h);
}
template <>
__device__ __forceinline__ float2 PairToFloat2<__nv_bfloat16>(uint32_t pair) {
  // bf16 -> fp32 is the 16 bits moved to the top of the word.
  return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xFFFF0000u));
}

template <typename T, int kTok>
__global__ void __launch_bounds__(32 * kSimtWarps) GemvSimtKernel(const __grid_constant__ SimtParams p) {
  static_assert(kSimtRows * kTok <= 32 * kSimtWarps, "one thread per (row, token) in the epilogue");
  using Dq = Int4Dequant<T>;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int row0 = static_cast<int>(blockIdx.x) * kSimtRows;
  const int tok0 = static_cast<int>(blockIdx.y) * kTok;
  const int m_count = min(kTok, p.M - tok0);
  const int chunks = p.K / 32;
  const T* scales = static_cast<const T*>(p.scales);
  const T* a = static_cast<const T*>(p.a);
  const uint8_t* zero_points = static_cast<const uint8_t*>(p.zero_points);

  // Rows past N read row 0 (a valid address) and are never stored.
  int rows[kSimtRows];
#pragma unroll
  for (int r = 0; r < kSimtRows; ++r) rows[r] = row0 + r < p.N ? row0 + r : 0;

  float acc[kSimtRows][kTok];
#pragma unroll
  for (int r = 0; r < kSimtRows; ++r)
#pragma unroll
    for (int m = 0; m < kTok; ++m) acc[r][m] = 0.f;

  for (int c = warp * 32 + lane; c < chunks; c += 32 * kSimtWarps) {
    const int blk = c >> p.chunk_shift;
    uint4 wv[kSimtRows];
    float scale[kSimtRows];
    typename Dq::Consts consts[kSimtRows];
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r) {
      // Streaming load (ld.global.cs): each weight byte is read once per pass.
      wv[r] = __ldcs(reinterpret_cast<const uint4*>(p.b + static_cast<int64_t>(rows[r]) * p.row_bytes) + c);
      scale[r] = ToFloat<T>(scales[static_cast<int64_t>(rows[r]) * p.k_blocks + blk]);
      uint32_t z = 8u;
      if (zero_points) {
        const uint8_t zb = __ldg(zero_points + static_cast<int64_t>(rows[r]) * p.zp_row_bytes + (blk >> 1));
        z = (blk & 1) ? (zb >> 4) : (zb & 15u);
      }
      consts[r] = Dq::Make(z);
    }
    // The chunk's 32 products per (row, token) are summed unscaled (exact small integers times the
    // activations), then scaled once: acc = fmaf(scale, chunk_sum, acc).
    float part[kSimtRows][kTok];
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r)
#pragma unroll
      for (int m = 0; m < kTok; ++m) part[r][m] = 0.f;
#pragma unroll
    for (int word = 0; word < 4; ++word) {
      // w[r][2j] = (q - z) of value k = j of the word, w[r][2j + 1] of value k = j + 4 (Int4Dequant's
      // pairs), as exact fp32.
      float w[kSimtRows][8];
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r) {
        const uint32_t bits = word == 0 ? wv[r].x : word == 1 ? wv[r].y : word == 2 ? wv[r].z : wv[r].w;
        uint32_t pairs[4];
        Dq::Run(bits, consts[r], pairs);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = PairToFloat2<T>(pairs[j]);
          w[r][2 * j] = f.x;
          w[r][2 * j + 1] = f.y;
        }
      }
#pragma unroll
      for (int m = 0; m < kTok; ++m) {
        if (m < m_count) {  // uniform per block
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(a + static_cast<int64_t>(tok0 + m) * p.K) + 4 * c + word);
          const float2 x01 = PairToFloat2<T>(xv.x), x23 = PairToFloat2<T>(xv.y);
          const float2 x45 = PairToFloat2<T>(xv.z), x67 = PairToFloat2<T>(xv.w);
          const float x[8] = {x01.x, x01.y, x23.x, x23.y, x45.x, x45.y, x67.x, x67.y};
#pragma unroll
          for (int r = 0; r < kSimtRows; ++r) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              part[r][m] = fmaf(x[j], w[r][2 * j], part[r][m]);
              part[r][m] = fmaf(x[j + 4], w[r][2 * j + 1], part[r][m]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r)
#pragma unroll
      for (int m = 0; m < kTok; ++m) acc[r][m] = fmaf(scale[r], part[r][m], acc[r][m]);
  }

#pragma unroll
  for (int r = 0; r < kSimtRows; ++r)
#pragma unroll
    for (int m = 0; m < kTok; ++m)
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) acc[r][m] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][m], offset);

  __shared__ float red[kSimtWarps][kSimtRows][kTok];
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r)
#pragma unroll
      for (int m = 0; m < kTok; ++m) red[warp][r][m] = acc[r][m];
  }
  __syncthreads();
  const int idx = threadIdx.x;
  if (idx < kSimtRows * kTok) {
    const int r = idx / kTok;
    const int m = idx % kTok;
    const int n = row0 + r;
    if (n < p.N && m < m_count) {
      float sum = red[0][r][m];
#pragma unroll
      for (int w = 1; w < kSimtWarps; ++w) sum += red[w][r][m];
      if (p.bias) sum += ToFloat<T>(static_cast<const T*>(p.bias)[n]);
      static_cast<T*>(p.y)[static_cast<int64_t>(tok0 + m) * p.N + n] = FromFloat<T>(sum);
    }
  }
}

}  // namespace gemv
}  // namespace ort_mtp
