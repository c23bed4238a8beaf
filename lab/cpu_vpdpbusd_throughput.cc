// The floor under the CPU int8 MatMulNBits kernel at M > 1: how many 512-bit vpdpbusd one core retires per
// second (12 independent accumulator chains, so throughput, not latency). Each one is 64 u8 x s8 MACs, and a
// 64-byte vector of int4 weights holds 128 weights, so an M-row call of an N x K layer needs
// M * N * K / 64 of them whatever the kernel does around them.
//
//   g++ -O2 -o /tmp/vpdpbusd lab/cpu_vpdpbusd_throughput.cc && /tmp/vpdpbusd
//
// Measured 2026-12-05 on the 2-core AMD EPYC (family 26) of the CPU sessions: 2.9e9 per second per core,
// so M = 8 on 4096 x 1024 needs >= 524K / (2 x 2.9e9) = 90 us on 2 cores against ~52 us for M = 1 (the
// weights' read at the copy bandwidth): M=8 / M=1 >= 1.7 on this machine (bench/results/2026-12-05-cpu-fusions).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
// Throughput of vpdpbusd zmm on one core: 12 independent accumulator chains.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double run(int64_t iters) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < iters; ++n) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    asm volatile("" : "+v"(a), "+v"(b));
  }
  auto t1 = std::chrono::steady_clock::now();
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, acc[i]);
  volatile int sink = _mm512_reduce_add_epi32(s);
  (void)sink;
  return std::chrono::duration<double>(t1 - t0).count();
}
int main() {
  const int64_t iters = 50'000'000;
  run(iters / 10);
  double best = 1e9;
  for (int r = 0; r < 5; ++r) { double t = run(iters); if (t < best) best = t; }
  printf("vpdpbusd zmm: %.3g per second per core (%.3f ns each)\n", iters * 12 / best, best / (iters * 12) * 1e9);
}
