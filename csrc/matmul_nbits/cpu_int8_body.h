// The int8-activation CPU MatMulNBits kernel (accuracy_level 4, 4-bit weights), written once over the
// traits `V` (float vectors: Hsum, Fma, ...) and `Q` (the integer dot product) and included by
// matmul_nbits_cpu.cc once per instruction set, after cpu_gemv_body.h (it uses LoadScalar, StoreY),
// inside that set's namespace with ORT_MTP_TARGET defined. No include guard on purpose.
//
// The arithmetic (matmul_nbits_cpu.cc's Int8 comment states it in full; the scalar kernel there is
// the same thing written without vectors): W = Q::kLanes int32 lanes, chunks of CK = 8 W elements of
// k; lane i of chunk c covers k = c CK + 8 i .. + 7, which lie in one block (block_size >= 16).
// Per output (m, n) and lane: for each chunk, ascending,
//   p   = sum over the lane's 8 k of qa[m, k] * q[n, k]                 (int32, exact)
//   d   = p - zp * qsum                                                  (int32, exact; qsum = the lane's sum of qa)
//         (typed zero points: d = fma(zp, -float(qsum), float(p)) in float)
//   acc = fma(float(d), scale_w[n, b] * scale_a[m, b], acc)              (b = the lane's block; the product rounded once)
// y = V::Hsum(acc) (a fixed tree) + bias, rounded once to Y's type. Nothing depends on M, the row
// tile, the column group or the thread: row i of an M-row call is bit-identical to the M=1 call.
//
// Layout of the quantised A (Int8Job, written by QuantizeA): per row and chunk, CK int8: first the
// CK / 2 values of even k (k = 0, 2, ..), then the odd ones, so that the low and high nibbles of the
// chunk's CK / 2 weight bytes (byte j = k 2 j low, 2 j + 1 high) meet their activations without any
// shuffle: dot(lo nibbles, even half) + dot(hi nibbles, odd half), 4 bytes per int32 lane.

// kCpuGroups: how far ahead of a group's unit the kernel asks for the group's next bytes (2 units).
constexpr int kGroupPrefetchBytes = 2 * kGroupUnitBytes;

// Scales of the blocks of chunk `ch` of column n, one per lane (BPC = blocks per chunk >= 1 ...).
template <int kType, int bs>
ORT_MTP_TARGET inline typename V::F LaneScales(const void* base, int64_t first_block) {
  constexpr int W = V::kLanes;
  constexpr int CK = 8 * W;
  if constexpr (bs >= CK) {
    return V::Set1(LoadScalar<kType>(base, first_block));
  } else {
    constexpr int BPC = CK / bs;  // blocks per chunk: 2 .. 8
    constexpr int LPB = bs / 8;   // lanes per block
    if constexpr (kType == 0) {
      return Q::template Expand<BPC, LPB>(static_cast<const float*>(base) + first_block);
    } else {
      alignas(64) float s[W] = {};
      for (int i = 0; i < BPC; ++i) s[i] = LoadScalar<kType>(base, first_block + i);
      return Q::template Expand<BPC, LPB>(s);
    }
  }
}

// The same for the last (partial) chunk: lanes past the last block get 0.
template <int kType, int bs>
ORT_MTP_TARGET inline typename V::F LaneScalesTail(const void* base, int64_t row0, int64_t ch, int64_t k_blocks) {
  constexpr int W = V::kLanes;
  alignas(64) float s[W];
  for (int i = 0; i < W; ++i) {
    const int64_t blk = (ch * 8 * W + 8 * i) / bs;
    s[i] = blk < k_blocks ? LoadScalar<kType>(base, row0 + blk) : 0.f;
  }
  return V::Loadu(s);
}

// Zero point of each lane's block (packed uint8: integer; typed: float); lanes past the last block: 0.
template <int bs>
ORT_MTP_TARGET inline typename Q::I LaneZpPacked(const MatMulNBitsProblem& p, int64_t n, int64_t ch) {
  constexpr int W = V::kLanes;
  alignas(64) int32_t z[W];
  const uint8_t* zrow = static_cast<const uint8_t*>(p.zero_points) + n * p.zp_row_bytes;
  for (int i = 0; i < W; ++i) {
    const int64_t blk = (ch * 8 * W + 8 * i) / bs;
    z[i] = blk < p.k_blocks ? ((blk & 1) ? (zrow[blk >> 1] >> 4) : (zrow[blk >> 1] & 0x0F)) : 0;
  }
  return Q::LoadI(z);
}

template <int kType, int bs>
ORT_MTP_TARGET inline typename V::F LaneZpTyped(const MatMulNBitsProblem& p, int64_t n, int64_t ch) {
  constexpr int W = V::kLanes;
  alignas(64) float z[W];
  for (int i = 0; i < W; ++i) {
    const int64_t blk = (ch * 8 * W + 8 * i) / bs;
    z[i] = blk < p.k_blocks ? LoadScalar<kType>(p.zero_points, n * p.k_blocks + blk) : 0.f;
  }
  return V::Loadu(z);
}

// One chunk for R rows x NC columns. kTail: the chunk runs past the end of a weight row.
template <int NC, int R, int kZp, int kType, int bs, bool kTail>
ORT_MTP_TARGET __attribute__((always_inline)) inline void Int8Step(const Int8Job& j, int64_t n0, int64_t m0,
                                                                    int64_t ch, typename V::F (&acc)[R][NC]) {
  constexpr int W = V::kLanes;
  constexpr int CK = 8 * W;
  constexpr int CB = CK / 2;  // weight bytes per chunk and column
  const MatMulNBitsProblem& p = *j.p;
  const int64_t row_bytes = p.k_blocks * (bs / 2);
  typename Q::I lo[NC], hi[NC];
  typename V::F sw[NC];
  [[maybe_unused]] typename Q::I zpi[NC];
  [[maybe_unused]] typename V::F zpf[NC];
  // kCpuGroups (matmul_nbits.h; only for N % 4 == 0 and K % 128 == 0, so NC = 4 and no tail chunk): the
  // chunk's bytes and scales where CpuGroupsByte / CpuGroupsScale put them; the same bytes as the
  // row-major rows hold.
  // The map is evaluated once per chunk, for column n0; column n0 + c is c * 64 bytes (c * 128 / bs
  // scales) further on in the same unit, so the per-column cost is one constant offset (the integer
  // index arithmetic of a full map per column competes with the vector work of this inner loop).
  const bool grouped = p.layout == WeightLayout::kCpuGroups;
  const int64_t k0 = ch * CK;
  const uint8_t* group_b = grouped ? p.b + CpuGroupsByte(p.K, n0, k0) : nullptr;
  const int64_t group_scale = grouped ? CpuGroupsScale(p.K, bs, n0, k0 / bs) : 0;
  if (grouped && k0 % kGroupK == 0) {  // the group's unit kGroupPrefetchBytes ahead, its 4 cache lines
    const char* ahead = reinterpret_cast<const char*>(group_b) + kGroupPrefetchBytes;
    for (int line = 0; line < kGroupUnitBytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
  }
  for (int c = 0; c < NC; ++c) {
    const int64_t n = n0 + c;
    if (grouped) {
      constexpr int kPerUnit = bs <= kGroupK ? kGroupK / bs : 1;
      const typename Q::I x = Q::LoadBytes(group_b + c * (kGroupK / 2));
      lo[c] = Q::Lo(x);
      hi[c] = Q::Hi(x);
      sw[c] = LaneScales<kType, bs>(p.scales, group_scale + c * kPerUnit);
      continue;
    }
    const uint8_t* src = p.b + n * row_bytes + ch * CB;
    typename Q::I x;
    if constexpr (kTail) {
      alignas(64) uint8_t tmp[CB] = {};
      std::memcpy(tmp, src, static_cast<size_t>(row_bytes - ch * CB));
      x = Q::LoadBytes(tmp);
      sw[c] = LaneScalesTail<kType, bs>(p.scales, n * p.k_blocks, ch, p.k_blocks);
    } else {
      _mm_prefetch(reinterpret_cast<const char*>(src) + kPrefetchBytes, _MM_HINT_T0);
      x = Q::LoadBytes(src);
      sw[c] = LaneScales<kType, bs>(p.scales, n * p.k_blocks + ch * CK / bs);
    }
    lo[c] = Q::Lo(x);
    hi[c] = Q::Hi(x);
    if constexpr (kZp == 1) zpi[c] = LaneZpPacked<bs>(p, n, ch);
    if constexpr (kZp == 2) zpf[c] = LaneZpTyped<kType, bs>(p, n, ch);
  }
  for (int r = 0; r < R; ++r) {
    const int64_t at = (m0 + r) * j.chunks + ch;
    const int8_t* qa = j.qa + at * CK;
    const typename Q::I qe = Q::LoadBytes(qa), qo = Q::LoadBytes(qa + CB);
    const typename Q::I ls = Q::LoadI(j.lane_sum + at * W);
    const typename V::F sa = V::Loadu(j.lane_scale + at * W);
    for (int c = 0; c < NC; ++c) {
      typename Q::I init;
      if constexpr (kZp == 0) {
        init = ls;  // -8 qsum
      } else if constexpr (kZp == 1) {
        init = Q::MulLo(zpi[c], ls);  // -zp qsum
      } else {
        init = Q::Zero();
      }
      typename V::F f = Q::Cvt(Q::Dot(init, lo[c], qe, hi[c], qo));
      if constexpr (kZp == 2) f = V::Fma(zpf[c], Q::Cvt(ls), f);  // p - zp qsum, one rounding
      acc[r][c] = V::Fma(f, V::Mul(sw[c], sa), acc[r][c]);
    }
  }
}

template <int NC, int R, int kZp, int kType, int bs>
ORT_MTP_TARGET void Int8Tile(const Int8Job& j, int64_t n0, int64_t m0) {
  const MatMulNBitsProblem& p = *j.p;
  typename V::F acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = V::Set1(0.f);
  for (int64_t ch = 0; ch < j.full_chunks; ++ch) Int8Step<NC, R, kZp, kType, bs, false>(j, n0, m0, ch, acc);
  if (j.chunks > j.full_chunks) Int8Step<NC, R, kZp, kType, bs, true>(j, n0, m0, j.full_chunks, acc);
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < NC; ++c) {
      const int64_t n = n0 + c;
      float v = V::Hsum(acc[r][c]);
      if (p.bias) v += LoadScalar<kType>(p.bias, n);
      StoreY<kType>(p.y, (m0 + r) * p.N + n, v);
    }
  }
}

// Columns n0 .. n0 + NC - 1, all M rows, in tiles of Q::kRows rows. A column group's weights (NC x K/2
// bytes) stay in L1 between row tiles, so B is read from memory once per call.
template <int NC, int kZp, int kType, int bs>
ORT_MTP_TARGET void Int8ColumnGroup(const Int8Job& j, int64_t n0) {
  constexpr int R = Q::kRows;
  const int64_t M = j.p->M;
  int64_t m = 0;
  for (; m + R <= M; m += R) Int8Tile<NC, R, kZp, kType, bs>(j, n0, m);
  if constexpr (R > 2) {
    if (M - m >= 2) {
      Int8Tile<NC, 2, kZp, kType, bs>(j, n0, m);
      m += 2;
    }
  }
  if (m < M) Int8Tile<NC, 1, kZp, kType, bs>(j, n0, m);
}

template <int kZp, int kType, int kBs>
ORT_MTP_TARGET void Int8ColumnRange(const Int8Job& j, int64_t g_begin, int64_t g_end) {
  constexpr int NC = 4;
  for (int64_t g = g_begin; g < g_end; ++g) {
    const int64_t n0 = g * NC;
    if (n0 + NC <= j.p->N) {
      Int8ColumnGroup<NC, kZp, kType, kBs>(j, n0);
    } else {
      for (int64_t n = n0; n < j.p->N; ++n) Int8ColumnGroup<1, kZp, kType, kBs>(j, n);
    }
  }
}

// A (widened to float32, [M, kp], zeros past K) -> the quantised rows of Int8Job (see
// matmul_nbits_cpu.cc's QuantizeRowPortable: the same values, vectorised).
ORT_MTP_TARGET void Int8Quantize(const float* a, int64_t M, int64_t kp, int bs, int64_t chunks, int zp0,
                                 int8_t* qa, int32_t* lane_sum, float* lane_scale, int8_t* tmp) {
  constexpr int W = V::kLanes;
  constexpr int CK = 8 * W;
  const int64_t kq = chunks * CK;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 lim = _mm256_set1_ps(127.f), nlim = _mm256_set1_ps(-127.f);
  const __m128i deint = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = a + m * kp;
    float* lsc = lane_scale + m * chunks * W;
    int32_t* lsm = lane_sum + m * chunks * W;
    int8_t* q = qa + m * kq;
    for (int64_t k0 = 0; k0 < kp; k0 += bs) {
      __m256 mx = _mm256_setzero_ps();
      for (int e = 0; e < bs; e += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(row + k0 + e), abs_mask));
      __m128 x = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      x = _mm_max_ps(x, _mm_movehl_ps(x, x));
      x = _mm_max_ss(x, _mm_movehdup_ps(x));
      const float s = _mm_cvtss_f32(x) / 127.f;
      if (s == 0.f) {
        std::memset(tmp + k0, 0, static_cast<size_t>(bs));
      } else {
        const __m256 sv = _mm256_set1_ps(s);
        for (int e = 0; e < bs; e += 8) {
          __m256 v = _mm256_div_ps(_mm256_loadu_ps(row + k0 + e), sv);
          v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          v = _mm256_min_ps(_mm256_max_ps(v, nlim), lim);
          const __m256i iv = _mm256_cvtps_epi32(v);
          const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(iv), _mm256_extracti128_si256(iv, 1));
          _mm_storel_epi64(reinterpret_cast<__m128i*>(tmp + k0 + e), _mm_packs_epi16(w16, w16));
        }
      }
      for (int64_t k = k0; k < k0 + bs; k += 8) lsc[k / 8] = s;  // lanes of this block
    }
    if (kq > kp) std::memset(tmp + kp, 0, static_cast<size_t>(kq - kp));
    for (int64_t i = kp / 8; i < kq / 8; ++i) lsc[i] = 0.f;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int8_t* t = tmp + ch * CK;
      int8_t* d = q + ch * CK;
      for (int e = 0; e < CK; e += 16) {
        const __m128i v = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + e)), deint);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(d + e / 2), v);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(d + CK / 2 + e / 2), _mm_unpackhi_epi64(v, v));
      }
      for (int i = 0; i < W; ++i) {
        int sum = 0;
        for (int e = 0; e < 8; ++e) sum += t[8 * i + e];
        lsm[ch * W + i] = -zp0 * sum;
      }
    }
  }
}

template <int kZp, int kType>
inline void Int8RangeByBlock(const Int8Job& j, int64_t b, int64_t e) {
  switch (j.p->block_size) {
    case 16: Int8ColumnRange<kZp, kType, 16>(j, b, e); break;
    case 32: Int8ColumnRange<kZp, kType, 32>(j, b, e); break;
    case 64: Int8ColumnRange<kZp, kType, 64>(j, b, e); break;
    case 128: Int8ColumnRange<kZp, kType, 128>(j, b, e); break;
    default: Int8ColumnRange<kZp, kType, 256>(j, b, e); break;
  }
}

template <int kZp>
inline void Int8RangeByType(const Int8Job& j, int64_t b, int64_t e) {
  switch (j.p->type) {
    case ElemType::kFloat32: Int8RangeByBlock<kZp, 0>(j, b, e); break;
    case ElemType::kFloat16: Int8RangeByBlock<kZp, 1>(j, b, e); break;
    case ElemType::kBFloat16: Int8RangeByBlock<kZp, 2>(j, b, e); break;
  }
}

inline void Int8RangeEntry(const Int8Job& j, int64_t g_begin, int64_t g_end) {
  switch (j.p->zp_kind) {
    case ZeroPointKind::kNone: Int8RangeByType<0>(j, g_begin, g_end); break;
    case ZeroPointKind::kPacked: Int8RangeByType<1>(j, g_begin, g_end); break;
    case ZeroPointKind::kTyped: Int8RangeByType<2>(j, g_begin, g_end); break;
  }
}

inline void Int8QuantizeEntry(const float* a, int64_t M, int64_t kp, int bs, int64_t chunks, int zp0, int8_t* qa,
                              int32_t* lane_sum, float* lane_scale, int8_t* tmp) {
  Int8Quantize(a, M, kp, bs, chunks, zp0, qa, lane_sum, lane_scale, tmp);
}
