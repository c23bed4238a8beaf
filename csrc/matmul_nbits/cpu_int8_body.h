// The int8-activation CPU MatMulNBits kernel (accuracy_level 4, 4-bit weights), written once over the
// traits `V` (float vectors: Fma, Mul, ...) and `Q` (the integer dot product and broadcasts) and
// included by matmul_nbits_cpu.cc once per instruction set, after cpu_gemv_body.h (it uses StoreY),
// inside that set's namespace with ORT_MTP_TARGET defined. No include guard on purpose.
//
// The arithmetic is matmul_nbits_cpu.cc's "Int8" definition; the kernel computes it 16 lanes at a
// time, lane L = 4 col + s of a unit (matmul_nbits.h: column col of a group of 4, segment s of a
// chunk): V::kLanes = 16 covers a unit in one vector (AVX-512), 8 in two halves (AVX2). Per lane and
// chunk: the segment's integer dot product in int32 (exact), one conversion, one product of the two
// scales and one fma into the lane's float accumulator. So the float work per row is one vector of
// three operations per 4 columns x 4 segments, and the integer work is the dot products themselves.
//
// Quantised A (Int8Job::qa, written by Int8Quantize): per row and chunk, for v = 0 .. kSegK / 8 - 1,
// 16 bytes of even k then 16 bytes of odd k, each 4 bytes per segment s: qa[start + s kSegK + 8 v +
// parity + 0, 2, 4, 6]. Broadcast to every 128-bit lane (one per column), they meet the low and high
// nibbles of a unit's vector v byte for byte.

// How far ahead of a unit of the grouped copy the kernel asks for the bytes it will read next: 6 units
// (measured on a 2-core EPYC: 2 units left the M = 2..8 tiles waiting on their weights).
template <int kSeg>
constexpr int kPrefetchAheadBytes = 6 * kGroupCols * kSegments * kSeg / 2;

// The 16 (or 8, from lane `first`) scales or typed zero points of a unit, as float32.
template <int kType>
ORT_MTP_TARGET inline typename V::F LoadLanes(const void* base, int first) {
  if constexpr (kType == 0) {
    return V::Loadu(static_cast<const float*>(base) + first);
  } else {
    return V::template LoadHalfFloats<kType>(static_cast<const uint16_t*>(base) + first);
  }
}

// Where a unit's bytes, scales and zero points are: in the grouped copy, or in `local`, the group's
// units gathered from the row-major weights (GatherUnit: the same bytes in the same places).
struct UnitPtrs {
  const uint8_t* b;
  const void* scales;
  const void* zp;
};

struct GroupUnits {  // a group's units in the kCpuGroups layout, or none (read the grouped copy)
  const uint8_t* b = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* zp = nullptr;
};

template <int kSeg>
ORT_MTP_TARGET inline UnitPtrs FindUnit(const Int8Job& j, int64_t g, int64_t c, const GroupUnits& local) {
  const MatMulNBitsProblem& p = *j.p;
  constexpr int kBytes = kGroupCols * kSegments * kSeg / 2;
  const size_t elem = ScaleBytes(p), zp_elem = GroupedZeroPointBytes(p);
  if (local.b) {
    return {local.b + c * kBytes, local.scales + c * kUnitLanes * elem, local.zp + c * kUnitLanes * zp_elem};
  }
  const int64_t unit = g * j.chunks + c;
  const uint8_t* b = p.b + unit * kBytes;
  for (int line = 0; line < kBytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(b) + kPrefetchAheadBytes<kSeg> + line, _MM_HINT_T0);
  return {b, static_cast<const uint8_t*>(p.scales) + unit * kUnitLanes * elem,
          p.zero_points ? static_cast<const uint8_t*>(p.zero_points) + unit * kUnitLanes * zp_elem : nullptr};
}

// Rows m0 .. m0 + R - 1 of the 4 columns of group g (kZp: 0 none, 1 packed uint8, 2 typed).
template <int R, int kZp, int kType, int kSeg>
ORT_MTP_TARGET void Int8Tile(const Int8Job& j, int64_t g, int64_t m0, const GroupUnits& local) {
  constexpr int NH = kUnitLanes / V::kLanes;  // vectors per unit row of lanes: 1 (AVX-512) or 2 (AVX2)
  constexpr int NV = kSeg / 8;                // 64-byte weight vectors per unit
  constexpr int CK = kSegments * kSeg;
  const MatMulNBitsProblem& p = *j.p;
  typename V::F acc[R][NH];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < NH; ++h) acc[r][h] = V::Set1(0.f);
  for (int64_t c = 0; c < j.chunks; ++c) {
    const UnitPtrs u = FindUnit<kSeg>(j, g, c, local);
    for (int h = 0; h < NH; ++h) {
      typename Q::I lo[NV], hi[NV];
      for (int v = 0; v < NV; ++v) {
        const typename Q::I x = Q::LoadBytes(u.b + 64 * v + h * (64 / NH));
        lo[v] = Q::Lo(x);
        hi[v] = Q::Hi(x);
      }
      const typename V::F sw = LoadLanes<kType>(u.scales, h * V::kLanes);
      [[maybe_unused]] typename Q::I zpi;
      [[maybe_unused]] typename V::F zpf;
      if constexpr (kZp == 1) zpi = Q::LoadU8Lanes(static_cast<const uint8_t*>(u.zp) + h * V::kLanes);
      if constexpr (kZp == 2) zpf = LoadLanes<kType>(u.zp, h * V::kLanes);
      for (int r = 0; r < R; ++r) {
        const int64_t at = (m0 + r) * j.chunks + c;
        const int8_t* qa = j.qa + at * CK;
        const typename Q::I ls = Q::Bcast128(j.lane_sum + at * kSegments);  // -zp0 qsum per segment
        typename Q::I d;
        if constexpr (kZp == 0) {
          d = ls;  // -8 qsum
        } else if constexpr (kZp == 1) {
          d = Q::MulLo(zpi, ls);  // -zp qsum
        } else {
          d = Q::Zero();
        }
        for (int v = 0; v < NV; ++v) d = Q::Dot(d, lo[v], Q::Bcast128(qa + 32 * v), hi[v], Q::Bcast128(qa + 32 * v + 16));
        typename V::F f = Q::Cvt(d);
        if constexpr (kZp == 2) f = V::Fma(zpf, Q::Cvt(ls), f);  // p - zp qsum, one rounding
        const typename V::F sa = V::Bcast4(j.lane_scale + at * kSegments);
        acc[r][h] = V::Fma(f, V::Mul(sw, sa), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(64) float lanes[kUnitLanes];
    for (int h = 0; h < NH; ++h) V::Storeu(lanes + h * V::kLanes, acc[r][h]);
    for (int col = 0; col < kGroupCols; ++col) {
      const int64_t n = g * kGroupCols + col;
      if (n >= p.N) break;
      const float* l = lanes + kSegments * col;
      float y = (l[0] + l[1]) + (l[2] + l[3]);
      if (p.bias) y += LoadScalar<kType>(p.bias, n);
      StoreY<kType>(p.y, (m0 + r) * p.N + n, y);
    }
  }
}

// The last `rows` (< Q::kRows) rows of group g in one tile.
template <int R, int kZp, int kType, int kSeg>
ORT_MTP_TARGET void Int8Rest(const Int8Job& j, int64_t g, int64_t m0, int rows, const GroupUnits& local) {
  if (rows == R) {
    Int8Tile<R, kZp, kType, kSeg>(j, g, m0, local);
  } else if constexpr (R > 1) {
    Int8Rest<R - 1, kZp, kType, kSeg>(j, g, m0, rows, local);
  }
}

// All M rows of group g, in tiles of Q::kRows rows (then one tile of the rest). A group's units stay
// in L1 between row tiles, so B is read from memory once per call. Row-major weights (no grouped copy:
// ORT_MTP_CPU_PACK=0, or weights that are not constant) are first gathered into the group's units,
// all of them before any is read (a load right after the small stores that wrote it would wait).
template <int kZp, int kType, int kSeg>
ORT_MTP_TARGET void Int8Group(const Int8Job& j, int64_t g) {
  constexpr int R = Q::kRows;
  const MatMulNBitsProblem& p = *j.p;
  GroupUnits local;
  if (p.layout != WeightLayout::kCpuGroups) {
    static thread_local std::vector<uint8_t> buffer;
    constexpr size_t kBytes = kGroupCols * kSegments * kSeg / 2;
    const size_t scale_bytes = kUnitLanes * 4, chunks = static_cast<size_t>(j.chunks);
    if (buffer.size() < chunks * (kBytes + 2 * scale_bytes)) buffer.resize(chunks * (kBytes + 2 * scale_bytes));
    uint8_t* b = buffer.data();
    uint8_t* scales = b + chunks * kBytes;
    uint8_t* zp = scales + chunks * scale_bytes;
    const size_t elem = ScaleBytes(p), zp_elem = GroupedZeroPointBytes(p);
    if (!GatherGroup(p, g, j.chunks, b, scales)) {
      for (int64_t c = 0; c < j.chunks; ++c)
        GatherUnit(p, g, c, b + c * kBytes, scales + c * kUnitLanes * elem, zp + c * kUnitLanes * zp_elem);
    }
    local = {b, scales, zp};
  }
  const int64_t M = p.M;
  int64_t m = 0;
  for (; m + R <= M; m += R) Int8Tile<R, kZp, kType, kSeg>(j, g, m, local);
  if (m < M) Int8Rest<R - 1, kZp, kType, kSeg>(j, g, m, static_cast<int>(M - m), local);
}

template <int kZp, int kType, int kSeg>
ORT_MTP_TARGET void Int8GroupRange(const Int8Job& j, int64_t g_begin, int64_t g_end) {
  for (int64_t g = g_begin; g < g_end; ++g) Int8Group<kZp, kType, kSeg>(j, g);
}

// A (widened to float32, [M, kp], zeros past K) -> the quantised rows of Int8Job (the definition's
// step 1; QuantizeRowPortable in matmul_nbits_cpu.cc is the same thing without vectors).
ORT_MTP_TARGET void Int8Quantize(const float* a, int64_t M, int64_t kp, int bs, int64_t chunks, int zp0,
                                 int8_t* qa, int32_t* lane_sum, float* lane_scale, int8_t* tmp) {
  const int seg = kSegK(bs), ck = kSegments * seg;
  const int64_t kq = chunks * ck;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 lim = _mm256_set1_ps(127.f), nlim = _mm256_set1_ps(-127.f);
  // bytes 0, 2, .., 14 then 1, 3, .., 15
  const __m128i deint = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m128i bias = _mm_set1_epi8(static_cast<char>(0x80));
  for (int64_t m = 0; m < M; ++m) {
    const float* row = a + m * kp;
    float* lsc = lane_scale + m * chunks * kSegments;
    int32_t* lsm = lane_sum + m * chunks * kSegments;
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
      for (int64_t k = k0; k < k0 + bs; k += seg) lsc[k / seg] = s;  // segments of this block
    }
    if (kq > kp) std::memset(tmp + kp, 0, static_cast<size_t>(kq - kp));
    for (int64_t i = kp / seg; i < kq / seg; ++i) lsc[i] = 0.f;
    for (int64_t i = 0; i < kq / seg; ++i) {  // segment sums: sum of (qa + 128) by SAD, less 128 per value
      const __m128i* t = reinterpret_cast<const __m128i*>(tmp + i * seg);
      __m128i sad = _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128(t), bias), _mm_setzero_si128());
      if (seg == 32) sad = _mm_add_epi64(sad, _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128(t + 1), bias), _mm_setzero_si128()));
      const int sum = _mm_cvtsi128_si32(_mm_add_epi64(sad, _mm_unpackhi_epi64(sad, sad))) - 128 * seg;
      lsm[i] = -zp0 * sum;
    }
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int8_t* t = tmp + ch * ck;
      int8_t* d = q + ch * ck;
      if (seg == 32) {
        // per segment s: E_s = its even bytes (dword v: k 8 v + 0, 2, 4, 6), O_s its odd ones; slice
        // (v, parity) = dword v of E_0 .. E_3 (or O): a 4 x 4 transpose of dwords.
        __m128i e[4], o[4];
        for (int s = 0; s < 4; ++s) {
          const __m128i t0 = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 32 * s)), deint);
          const __m128i t1 = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 32 * s + 16)), deint);
          e[s] = _mm_unpacklo_epi64(t0, t1);
          o[s] = _mm_unpackhi_epi64(t0, t1);
        }
        for (int parity = 0; parity < 2; ++parity) {
          const __m128i* x = parity ? o : e;
          const __m128i a01l = _mm_unpacklo_epi32(x[0], x[1]), a01h = _mm_unpackhi_epi32(x[0], x[1]);
          const __m128i a23l = _mm_unpacklo_epi32(x[2], x[3]), a23h = _mm_unpackhi_epi32(x[2], x[3]);
          const __m128i v0 = _mm_unpacklo_epi64(a01l, a23l), v1 = _mm_unpackhi_epi64(a01l, a23l);
          const __m128i v2 = _mm_unpacklo_epi64(a01h, a23h), v3 = _mm_unpackhi_epi64(a01h, a23h);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 0 + 16 * parity), v0);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 32 + 16 * parity), v1);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 64 + 16 * parity), v2);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 96 + 16 * parity), v3);
        }
      } else {
        ArrangeChunk(t, seg, d);
      }
    }
  }
}

template <int kZp, int kType>
inline void Int8RangeBySeg(const Int8Job& j, int64_t b, int64_t e) {
  if (kSegK(j.p->block_size) == 32) {
    Int8GroupRange<kZp, kType, 32>(j, b, e);
  } else {
    Int8GroupRange<kZp, kType, 16>(j, b, e);
  }
}

template <int kZp>
inline void Int8RangeByType(const Int8Job& j, int64_t b, int64_t e) {
  switch (j.p->type) {
    case FloatType::kFloat32: Int8RangeBySeg<kZp, 0>(j, b, e); break;
    case FloatType::kFloat16: Int8RangeBySeg<kZp, 1>(j, b, e); break;
    case FloatType::kBFloat16: Int8RangeBySeg<kZp, 2>(j, b, e); break;
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
