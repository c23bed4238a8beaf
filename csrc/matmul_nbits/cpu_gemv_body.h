// The fast CPU MatMulNBits kernel's body, written once over a vector-traits struct `V` and included by
// matmul_nbits_cpu.cc once per instruction set (inside its own namespace, with ORT_MTP_TARGET set to
// that set's function attribute). No include guard on purpose.
//
// Per output (m, n) the arithmetic is fixed, whatever M, the row tiling, the column group or the
// thread count (so row i of an M-row call is bit-identical to the M=1 call on row i):
//   for each block b (ascending):  q'[k] = float(q[n, k] - zp)           (exact for integer zero points)
//     s = a[m, k0 .. k0+W) * q'  then  s = fma(a[m, k0+W*j ..], q'.., s) for j = 1 .. block/W - 1
//     acc = fma(s, scale[n, b], acc)                                      (W lanes, one rounding per block)
//   y = hsum(acc) (V::Hsum, a fixed tree) + bias, rounded once to Y's type.
// A is widened to float32 once per call into a buffer padded with zeros to whole blocks, so a partial
// last block adds exact zeros. Weights of a group of NC columns are dequantised once per block into
// an L1 buffer and reused by every row of A: B is read from memory once per call.

template <int kType>
ORT_MTP_TARGET inline float LoadScalar(const void* base, int64_t i) {
  if constexpr (kType == 0) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (kType == 1) {
    return _cvtsh_ss(static_cast<const uint16_t*>(base)[i]);
  } else {
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
}

// A [M, K] of type kType -> float32 [M, kp], zero-padded past K.
template <int kType>
ORT_MTP_TARGET void WidenA(const void* a, int64_t M, int64_t K, int64_t kp, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    float* dst = out + m * kp;
    int64_t k = 0;
    if constexpr (kType == 0) {
      std::memcpy(dst, static_cast<const float*>(a) + m * K, sizeof(float) * static_cast<size_t>(K));
      k = K;
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(a) + m * K;
      for (; k + 8 <= K; k += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
        __m256 f;
        if constexpr (kType == 1) {
          f = _mm256_cvtph_ps(h);
        } else {
          f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
        _mm256_storeu_ps(dst + k, f);
      }
      for (; k < K; ++k) dst[k] = LoadScalar<kType>(src, k);
    }
    for (; k < kp; ++k) dst[k] = 0.f;
  }
}

template <int kType>
ORT_MTP_TARGET inline void StoreY(void* y, int64_t i, float v) {
  if constexpr (kType == 0) {
    static_cast<float*>(y)[i] = v;
  } else if constexpr (kType == 1) {
    static_cast<uint16_t*>(y)[i] = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
  } else {
    static_cast<Ort::BFloat16_t*>(y)[i] = Ort::BFloat16_t(v);
  }
}

// One row tile: R rows of A x NC dequantised columns, one block (bs elements).
// acc: [R][NC][W] floats, updated in place.
template <int NC, int R, int bs>
ORT_MTP_TARGET __attribute__((always_inline)) inline void RowTile(const float* q, const float* a,
                                                                   int64_t kp, const float* scale, float* acc) {
  constexpr int W = V::kLanes;
  typename V::F s[R][NC];
  {
    typename V::F qv[NC];
    for (int c = 0; c < NC; ++c) qv[c] = V::Load(q + c * bs);
    for (int r = 0; r < R; ++r) {
      const typename V::F av = V::Loadu(a + r * kp);
      for (int c = 0; c < NC; ++c) s[r][c] = V::Mul(av, qv[c]);
    }
  }
  for (int e = W; e < bs; e += W) {
    typename V::F qv[NC];
    for (int c = 0; c < NC; ++c) qv[c] = V::Load(q + c * bs + e);
    for (int r = 0; r < R; ++r) {
      const typename V::F av = V::Loadu(a + r * kp + e);
      for (int c = 0; c < NC; ++c) s[r][c] = V::Fma(av, qv[c], s[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < NC; ++c) {
      float* p = acc + (r * NC + c) * W;
      V::Storeu(p, V::Fma(s[r][c], V::Set1(scale[c]), V::Loadu(p)));
    }
  }
}

// Columns n0 .. n0 + NC - 1, all M rows. acc: scratch of M * NC * W floats.
constexpr int kPrefetchBytes = 768;

template <int NC, int kBits, int kZp, int kType, int bs>
ORT_MTP_TARGET void ColumnGroup(const FastJob& j, int64_t n0, float* acc) {
  constexpr int W = V::kLanes;
  constexpr int R = V::kRows;
  const MatMulNBitsProblem& p = *j.p;
  const int64_t M = p.M, kp = j.kp;
  std::memset(acc, 0, sizeof(float) * static_cast<size_t>(M * NC * W));
  alignas(64) float q[NC * 256];
  float scale[NC];
  const uint8_t* b_col[NC];
  int64_t s_col[NC];
  for (int c = 0; c < NC; ++c) {
    b_col[c] = p.b + (n0 + c) * p.k_blocks * (bs * kBits / 8);
    s_col[c] = (n0 + c) * p.k_blocks;
  }
  for (int64_t blk = 0; blk < p.k_blocks; ++blk) {
    for (int c = 0; c < NC; ++c) {
      const int64_t n = n0 + c;
      const uint8_t* src = b_col[c] + blk * (bs * kBits / 8);
      int zpi = 1 << (kBits - 1);
      float zpf = 0.f;
      if constexpr (kZp == 1) {
        const uint8_t* zrow = static_cast<const uint8_t*>(p.zero_points) + n * p.zp_row_bytes;
        if constexpr (kBits == 8) {
          zpi = zrow[blk];
        } else {
          const uint8_t byte = zrow[blk >> 1];
          zpi = (blk & 1) ? (byte >> 4) : (byte & 0x0F);
        }
      } else if constexpr (kZp == 2) {
        zpf = LoadScalar<kType>(p.zero_points, n * p.k_blocks + blk);
      }
      // Software prefetch a few blocks ahead: NC + NC streams (B, scales) at a large stride do not
      // keep the hardware prefetcher ahead of the loads on its own.
      _mm_prefetch(reinterpret_cast<const char*>(src) + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(static_cast<const char*>(p.scales)) +
                       (s_col[c] + blk) * (kType == 0 ? 4 : 2) + kPrefetchBytes / 4, _MM_HINT_T0);
      float* qc = q + c * bs;
      for (int e = 0; e < bs; e += 16) V::template Dequant16<kBits, kZp == 2>(src + e * kBits / 8, zpi, zpf, qc + e);
      scale[c] = LoadScalar<kType>(p.scales, s_col[c] + blk);
    }
    const float* a = j.a + blk * bs;
    int64_t m = 0;
    for (; m + R <= M; m += R) RowTile<NC, R, bs>(q, a + m * kp, kp, scale, acc + m * NC * W);
    for (; m < M; ++m) RowTile<NC, 1, bs>(q, a + m * kp, kp, scale, acc + m * NC * W);
  }
  for (int64_t m = 0; m < M; ++m) {
    for (int c = 0; c < NC; ++c) {
      const int64_t n = n0 + c;
      float v = V::Hsum(V::Loadu(acc + (m * NC + c) * W));
      if (p.bias) v += LoadScalar<kType>(p.bias, n);
      StoreY<kType>(p.y, m * p.N + n, v);
    }
  }
}

template <int kBits, int kZp, int kType, int kBs>
ORT_MTP_TARGET void ColumnRange(const FastJob& j, int64_t g_begin, int64_t g_end) {
  constexpr int NC = 4;
  static thread_local std::vector<float> acc_buf;
  const size_t need = static_cast<size_t>(j.p->M * NC * V::kLanes);
  if (acc_buf.size() < need) acc_buf.resize(need);
  float* acc = acc_buf.data();
  for (int64_t g = g_begin; g < g_end; ++g) {
    const int64_t n0 = g * NC;
    switch (std::min<int64_t>(NC, j.p->N - n0)) {
      case 4: ColumnGroup<4, kBits, kZp, kType, kBs>(j, n0, acc); break;
      case 3: ColumnGroup<3, kBits, kZp, kType, kBs>(j, n0, acc); break;
      case 2: ColumnGroup<2, kBits, kZp, kType, kBs>(j, n0, acc); break;
      default: ColumnGroup<1, kBits, kZp, kType, kBs>(j, n0, acc); break;
    }
  }
}

template <int kType>
ORT_MTP_TARGET void Widen(const FastJob& j, float* out) {
  WidenA<kType>(j.p->a, j.p->M, j.p->K, j.kp, out);
}

// The entry points matmul_nbits_cpu.cc reaches through a table (one per instruction set).
inline void WidenEntry(const FastJob& j, float* out) {
  switch (j.p->type) {
    case FloatType::kFloat32: Widen<0>(j, out); break;
    case FloatType::kFloat16: Widen<1>(j, out); break;
    case FloatType::kBFloat16: Widen<2>(j, out); break;
  }
}

template <int kBits, int kZp, int kType>
inline void RangeByBlock(const FastJob& j, int64_t b, int64_t e) {
  switch (j.p->block_size) {
    case 16: ColumnRange<kBits, kZp, kType, 16>(j, b, e); break;
    case 32: ColumnRange<kBits, kZp, kType, 32>(j, b, e); break;
    case 64: ColumnRange<kBits, kZp, kType, 64>(j, b, e); break;
    case 128: ColumnRange<kBits, kZp, kType, 128>(j, b, e); break;
    default: ColumnRange<kBits, kZp, kType, 256>(j, b, e); break;
  }
}

template <int kBits, int kZp>
inline void RangeByType(const FastJob& j, int64_t b, int64_t e) {
  switch (j.p->type) {
    case FloatType::kFloat32: RangeByBlock<kBits, kZp, 0>(j, b, e); break;
    case FloatType::kFloat16: RangeByBlock<kBits, kZp, 1>(j, b, e); break;
    case FloatType::kBFloat16: RangeByBlock<kBits, kZp, 2>(j, b, e); break;
  }
}

template <int kBits>
inline void RangeByZp(const FastJob& j, int64_t b, int64_t e) {
  switch (j.p->zp_kind) {
    case ZeroPointKind::kNone: RangeByType<kBits, 0>(j, b, e); break;
    case ZeroPointKind::kPacked: RangeByType<kBits, 1>(j, b, e); break;
    case ZeroPointKind::kTyped: RangeByType<kBits, 2>(j, b, e); break;
  }
}

inline void RangeEntry(const FastJob& j, int64_t g_begin, int64_t g_end) {
  if (j.p->bits == 8) {
    RangeByZp<8>(j, g_begin, g_end);
  } else {
    RangeByZp<4>(j, g_begin, g_end);
  }
}
