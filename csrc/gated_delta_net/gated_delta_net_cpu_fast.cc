// The CPU kernel of GatedDeltaNet that runs by default: the reference's arithmetic (gated_delta_net_cpu.cc:
// the same operations, the same points where a value is rounded to its tensor's type) in float32 instead
// of double, vectorised across a state row's columns, with silu::Exp for every exponential.
//
// One task per (batch, v head) runs the call's tokens in order. For each token it computes what the head
// reads: the causal conv + SiLU of its q, k and v channels, the l2 norms of q and k, q's scale, its gates;
// then the delta rule on the head's state and the gated RMS norm of its output row. A q/k head shared by
// Hv / Hk v heads is computed by each of their tasks, the same operations on the same inputs, so every
// task sees the same values, and one pass over the thread pool per call suffices (the reference takes
// two: its features first, for all heads). The conv state slots are written after that pass (copies,
// gated_delta_net_cpu_common.h), once every task has read the past conv state.
//
// Why it gives the same bits for a width-S call as for S width-1 calls, at any thread count, on any
// x86-64 CPU: each value is computed by one task, in an order fixed by the shapes alone (sums over a
// state row's index i ascending, each column j its own lane; sums of squares in 8 lanes i % 8, then a
// fixed tree); the state is rounded to its type after every token, as a width-1 call stores it; and the
// file is compiled with -ffp-contract=off (CMakeLists.txt), so the AVX-512, AVX2+FMA and baseline clones
// (target_clones, picked at load) fuse no multiply-add: their only fmas are silu::Exp's explicit ones,
// which every clone computes exactly (an instruction, or the C library's correctly rounded fmaf).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu_numeric.h"
#include "gated_delta_net/gated_delta_net.h"
#include "gated_delta_net/gated_delta_net_cpu_common.h"
#include "matmul_nbits/silu_mul.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ORT_MTP_GDN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ORT_MTP_GDN_CLONES
#endif

namespace ort_mtp {
namespace {

using cpu::FromFloat;
using cpu::ToFloat;

// v rounded to T and widened back: the value a T tensor holds.
template <typename T>
inline float AsT(float v) {
  return ToFloat(FromFloat<T>(v));
}

// sum x_i^2 in 8 lanes (lane i % 8, i ascending), then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
inline float SumSquares(const float* x, int64_t n) {
  float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += x[i + l] * x[i + l];
  }
  for (int l = 0; i < n; ++i, ++l) lane[l] += x[i] * x[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// x <- T(silu(x)) over n channels (the conv output tensor, rounded to T).
template <typename T>
ORT_MTP_GDN_CLONES void SiluToT(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = AsT<T>(silu::SiluMul(x[i], 1.0f));
}

// acc[i] += w[i K + j] x[i x_stride] over n channels: tap j of the causal conv (w: the first channel's
// K weights; x: the first channel's input at that tap, from the call's qkv rows, stride 1, or from the
// past conv state, stride K - 1). kK > 0: K and the stride known at compile time (Qwen3.5's K = 4), so
// the strided loads vectorise.
template <typename T, int kK, int kStride>
ORT_MTP_GDN_CLONES void ConvTap(float* acc, const T* w, int64_t K_runtime, int64_t j, const T* x,
                                int64_t stride_runtime, int64_t n) {
  const int64_t K = kK > 0 ? kK : K_runtime, stride = kK > 0 ? kStride : stride_runtime;
  for (int64_t i = 0; i < n; ++i) acc[i] += ToFloat(w[i * K + j]) * ToFloat(x[i * stride]);
}

// LinearAttentionGate for one head and token: decay = exp(g), g = T(neg_exp_A * softplus(a + dt_bias)),
// and beta = T(sigmoid(b)).
template <typename T>
ORT_MTP_GDN_CLONES void Gate(float a, float b, float dt_bias, float neg_exp_a, float* decay, float* beta) {
  const float x = a + dt_bias;
  const float softplus = x > 0.f ? x + std::log1p(silu::Exp(-x)) : std::log1p(silu::Exp(x));
  *decay = silu::Exp(AsT<T>(neg_exp_a * softplus));
  *beta = AsT<T>(1.0f / (1.0f + silu::Exp(-b)));
}

// LpNormalization(p=2) of one head (x / sqrt(sum x^2 + l2norm_epsilon); a zero vector stays zero),
// rounded to T; for q then times scale, rounded again (the q_scaled Mul).
template <typename T>
ORT_MTP_GDN_CLONES void L2NormalizeToT(float* x, int64_t n, float l2norm_epsilon, bool is_q, float scale) {
  const float norm = std::sqrt(SumSquares(x, n) + l2norm_epsilon);
  if (!(norm > 0.f)) {
    for (int64_t i = 0; i < n; ++i) x[i] = 0.f;
    return;
  }
  for (int64_t i = 0; i < n; ++i) x[i] = AsT<T>(x[i] / norm);
  if (is_q) {
    for (int64_t i = 0; i < n; ++i) x[i] = AsT<T>(x[i] * scale);
  }
}

// One token of the gated delta rule on a [dk, dv] state, in float32:
//   S *= decay;  r = S^T k;  S += k (beta (v - r))^T;  o = S^T q    (every sum over i ascending)
// in two sweeps over the state's rows, as the reference's DeltaRuleStep. `src` holds the state before the
// token (the past slot, or the last token's values); the state after it, rounded to the stored type S,
// goes to `dst` (as float, for the next token; nullptr: none follows) and to `out` (a present slot;
// nullptr: none). src may equal dst or out (row i is read before it is written). kDv > 0: dv known at
// compile time, so r and o stay in registers.
template <typename Src, typename S, int kDv>
ORT_MTP_GDN_CLONES void DeltaRuleStep(const Src* src, float* dst, S* out, const float* q, const float* k,
                                      const float* v, float decay, float beta, int64_t dk, int64_t dv_runtime,
                                      float* r_scratch, float* o_out) {
  constexpr int64_t kMax = kDv > 0 ? kDv : 1;
  const int64_t dv = kDv > 0 ? kDv : dv_runtime;
  float r_local[kMax], o_local[kMax];
  float* r = kDv > 0 ? r_local : r_scratch;
  float* o = kDv > 0 ? o_local : o_out;
  for (int64_t j = 0; j < dv; ++j) r[j] = 0.f;
  for (int64_t i = 0; i < dk; ++i) {
    const float ki = k[i];
    const Src* row = src + i * dv;
    for (int64_t j = 0; j < dv; ++j) r[j] += (ToFloat(row[j]) * decay) * ki;
  }
  for (int64_t j = 0; j < dv; ++j) r[j] = beta * (v[j] - r[j]);  // r is now the update delta
  for (int64_t j = 0; j < dv; ++j) o[j] = 0.f;
  for (int64_t i = 0; i < dk; ++i) {
    const float ki = k[i], qi = q[i];
    const Src* row = src + i * dv;
    float* dst_row = dst ? dst + i * dv : nullptr;
    S* out_row = out ? out + i * dv : nullptr;
    for (int64_t j = 0; j < dv; ++j) {
      const float x = ToFloat(row[j]) * decay + ki * r[j];
      o[j] += qi * x;
      const S stored = FromFloat<S>(x);
      if (out_row) out_row[j] = stored;
      if (dst_row) dst_row[j] = ToFloat(stored);
    }
  }
  if (kDv > 0) {
    for (int64_t j = 0; j < dv; ++j) o_out[j] = o[j];
  }
}

// GatedRMSNorm of one v head's row: o rounded to T (LinearAttention's output tensor), then
// y = T(o * rsqrt(mean(o^2) + epsilon) * norm_weight * silu(z)), left to right.
template <typename T>
ORT_MTP_GDN_CLONES void GatedRmsNorm(float* o, const T* z, const T* weight, T* y, int64_t dv, float epsilon) {
  for (int64_t j = 0; j < dv; ++j) o[j] = AsT<T>(o[j]);
  const float inv_rms = 1.0f / std::sqrt(SumSquares(o, dv) / static_cast<float>(dv) + epsilon);
  for (int64_t j = 0; j < dv; ++j)
    y[j] = FromFloat<T>(o[j] * inv_rms * ToFloat(weight[j]) * silu::SiluMul(ToFloat(z[j]), 1.0f));
}

template <typename T>
class Kernel {
 public:
  explicit Kernel(const GatedDeltaNetProblem& p) : p_(p) {}

  // Task (b, h): v head h of batch b over the call's tokens.
  void Task(int64_t task) {
    if (p_.state_type == FloatType::kFloat32)
      Head<float>(task);
    else
      Head<T>(task);
  }

 private:
  // Causal conv + SiLU of channels first .. first + n - 1 at token t of batch b, each rounded to T:
  // bias + sum_j w[c, j] x[t - (K - 1) + j], j ascending; a position before the call's first token reads
  // the past conv state, whose last position holds token -1.
  void ConvSilu(int64_t b, int64_t t, int64_t first, int64_t n, float* out) const {
    const int64_t C = p_.conv_dim(), K = p_.conv_kernel, L = p_.conv_state_len();
    const T* bias = static_cast<const T*>(p_.conv_bias);
    for (int64_t i = 0; i < n; ++i) out[i] = bias ? ToFloat(bias[first + i]) : 0.f;
    const T* w = static_cast<const T*>(p_.conv_weight) + first * K;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t pos = t - (K - 1) + j;
      const bool from_qkv = pos >= 0;
      const T* x = from_qkv ? static_cast<const T*>(p_.qkv) + (b * p_.seq + pos) * C + first
                            : static_cast<const T*>(p_.past_conv) + (b * C + first) * L + (L + pos);
      if (K == 4 && from_qkv)
        ConvTap<T, 4, 1>(out, w, K, j, x, 1, n);
      else if (K == 4)
        ConvTap<T, 4, 3>(out, w, K, j, x, L, n);
      else
        ConvTap<T, 0, 0>(out, w, K, j, x, from_qkv ? 1 : L, n);
    }
    SiluToT<T>(out, n);
  }

  void Gates(int64_t row, int64_t h, float* decay, float* beta) const {
    const int64_t i = row * p_.num_v_heads + h;
    Gate<T>(ToFloat(static_cast<const T*>(p_.a)[i]), ToFloat(static_cast<const T*>(p_.b)[i]),
            static_cast<float>(gdn_cpu::LoadAny(p_.dt_bias, p_.dt_bias_type, h)),
            static_cast<float>(gdn_cpu::LoadAny(p_.neg_exp_a, p_.neg_exp_a_type, h)), decay, beta);
  }

  template <typename S>
  void Head(int64_t task) {
    const int64_t b = task / p_.num_v_heads, h = task % p_.num_v_heads;
    const int64_t hk = h / (p_.num_v_heads / p_.num_k_heads);  // repeat_interleave, as HF and ORT
    const int64_t dk = p_.k_head_dim, dv = p_.v_head_dim, block = dk * dv, kd = p_.key_dim();
    thread_local std::vector<float> state, q, k, v, r, o;  // a task's only allocations, once per thread
    for (auto* buf : {&q, &k}) buf->resize(static_cast<size_t>(dk));
    for (auto* buf : {&v, &r, &o}) buf->resize(static_cast<size_t>(dv));
    if (p_.seq > 1) state.resize(static_cast<size_t>(block));
    const S* past = static_cast<const S*>(p_.past_recurrent) + task * block;
    auto slot_out = [&](int64_t slot) {
      return static_cast<S*>(p_.present_recurrent) + (slot * p_.batch * p_.num_v_heads + task) * block;
    };
    const T* norm_weight = static_cast<const T*>(p_.norm_weight);

    for (int64_t t = 0; t < p_.seq; ++t) {
      const int64_t row = b * p_.seq + t;
      ConvSilu(b, t, hk * dk, dk, q.data());
      L2NormalizeToT<T>(q.data(), dk, p_.l2norm_epsilon, /*is_q=*/true, p_.scale);
      ConvSilu(b, t, kd + hk * dk, dk, k.data());
      L2NormalizeToT<T>(k.data(), dk, p_.l2norm_epsilon, /*is_q=*/false, p_.scale);
      ConvSilu(b, t, 2 * kd + h * dv, dv, v.data());
      float decay, beta;
      Gates(row, h, &decay, &beta);

      const int64_t slot = t - (p_.seq - p_.slots);  // the present slot holding the state after token t
      S* out = slot >= 0 ? slot_out(slot) : nullptr;
      float* dst = t + 1 < p_.seq ? state.data() : nullptr;
      if (t == 0)
        Step<S, S>(past, dst, out, q, k, v, decay, beta, r, o);
      else
        Step<float, S>(state.data(), dst, out, q, k, v, decay, beta, r, o);

      const int64_t offset = row * p_.value_dim() + h * dv;
      GatedRmsNorm<T>(o.data(), static_cast<const T*>(p_.z) + offset, norm_weight, static_cast<T*>(p_.y) + offset,
                      dv, p_.epsilon);
    }
    // Slots before the call's first token hold zeros. Written last: the past slot has been read by then.
    for (int64_t slot = 0; slot < p_.slots - p_.seq; ++slot) gdn_cpu::ZeroSlot(slot_out(slot), sizeof(S) * block);
  }

  template <typename Src, typename S>
  void Step(const Src* src, float* dst, S* out, const std::vector<float>& q, const std::vector<float>& k,
            const std::vector<float>& v, float decay, float beta, std::vector<float>& r, std::vector<float>& o) const {
    const int64_t dk = p_.k_head_dim, dv = p_.v_head_dim;
    if (dv == 64)  // Qwen3.5's small shapes
      DeltaRuleStep<Src, S, 64>(src, dst, out, q.data(), k.data(), v.data(), decay, beta, dk, dv, r.data(), o.data());
    else if (dv == 128)  // Qwen3.5's large shapes
      DeltaRuleStep<Src, S, 128>(src, dst, out, q.data(), k.data(), v.data(), decay, beta, dk, dv, r.data(), o.data());
    else
      DeltaRuleStep<Src, S, 0>(src, dst, out, q.data(), k.data(), v.data(), decay, beta, dk, dv, r.data(), o.data());
  }

  const GatedDeltaNetProblem& p_;
};

template <typename T>
void Run(const GatedDeltaNetProblem& p, ParallelFor parallel_for, void* context) {
  Kernel<T> kernel(p);
  cpu::ForEach<Kernel<T>, &Kernel<T>::Task>(kernel, p.batch * p.num_v_heads, parallel_for, context);
  // Only once every task has read its past conv inputs: present_conv may alias past_conv.
  for (int64_t b = 0; b < p.batch; ++b) gdn_cpu::ConvStates<T>(p, b);
}

}  // namespace

void GatedDeltaNetCpu(const GatedDeltaNetProblem& p, ParallelFor parallel_for, void* parallel_context) {
  if (cpu::ReferenceKernelsRequested()) {
    GatedDeltaNetCpuReference(p, parallel_for, parallel_context);
    return;
  }
  cpu::WithElementType(p.type, [&](auto t) { Run<decltype(t)>(p, parallel_for, parallel_context); });
}

}  // namespace ort_mtp
