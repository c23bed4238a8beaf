// CPU reference kernel of GatedDeltaNet (ORT_MTP_CPU_KERNEL=reference; by default the float32 kernel of
// gated_delta_net_cpu_fast.cc runs, which the tests hold to this one). Written for exactness and row
// independence, not speed: every value is computed in double, token by token, in an order fixed by the
// problem's dimensions alone, and rounded (to float32, then to its tensor's type) exactly where the
// com.microsoft subgraph materialises a tensor. The recurrent state is rounded to its stored type after
// every token, as a width-1 call stores it, so a call of width S is bit-identical to S calls of width 1.
//
// Three passes: (1) per (batch, token, head): causal conv + SiLU of every channel, l2 norm of q and k per
// head, q scale, and the gates, into a float scratch (the values are T's, exactly); (2) per batch: the
// present conv state slots (gated_delta_net_cpu_common.h); (3) per (batch, v head): the gated delta
// recurrence and GatedRMSNorm.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/cpu_numeric.h"
#include "gated_delta_net/gated_delta_net.h"
#include "gated_delta_net/gated_delta_net_cpu_common.h"

namespace ort_mtp {
namespace {

using cpu::Round;
using cpu::Rounded;
using cpu::ToDouble;

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double Silu(double x) { return x * Sigmoid(x); }
// log(1 + e^x) without overflow for large x.
double Softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

// Per-token values the recurrence reads, for all batches and tokens: what the subgraph's q_scaled,
// k_l2norm, v, decay and beta tensors hold (T values, stored as float, which holds them exactly).
struct Features {
  std::vector<float> q, k, v;  // [B, S, Hk, dk], [B, S, Hk, dk], [B, S, Hv, dv]
  std::vector<float> g, beta;  // [B, S, Hv]
};

// One token of the gated delta rule on a [dk, dv] state, in double:
//   S *= exp(g);  r = S^T k;  S += k (beta (v - r))^T;  o = S^T q    (every sum over i in ascending order)
// then the state rounded to its stored type S (as a width-1 call stores it; `out`, if not null, gets
// the rounded values too), in two sweeps over the state's rows: row i is decayed and then added into
// r; after r becomes the update delta, row i is decayed again (the same double product), updated,
// added into o, and rounded. Between tokens the state holds values of S, which float32 represents
// exactly, so it is kept in float32 (half the bytes of double; each element widened where it is read):
// the same values and operations as a double state, so the same bits. Each element goes
// through the same operations in the same order as in separate passes (a row's decay comes before its
// use in r, its update before its use in o, its rounding after that use, and each sum still runs over
// i ascending), with a third of the trips through memory. Each loop runs over the columns j innermost,
// so the compiler vectorises it across columns without changing any element's order of operations;
// this file is compiled with -ffp-contract=off (CMakeLists), so no multiply-add is fused either: every
// clone below computes the same bits as the scalar code, and the one the CPU supports (AVX-512, AVX2,
// or baseline x86-64) is picked at load time.
// kDv > 0: dv == kDv known at compile time, so r and o stay in registers across the rows (the same
// operations on each element in the same order as the general form, kDv = 0).
template <typename S, int kDv>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void DeltaRuleStep(float* state, double* r_out, double* o_out, const float* q, const float* k, const float* v,
                   double decay, double beta, int64_t dk, int64_t dv_runtime, S* out) {
  constexpr int64_t kMax = kDv > 0 ? kDv : 1;
  const int64_t dv = kDv > 0 ? kDv : dv_runtime;
  double r_local[kMax], o_local[kMax];
  double* r = kDv > 0 ? r_local : r_out;
  double* o = kDv > 0 ? o_local : o_out;
  for (int64_t j = 0; j < dv; ++j) r[j] = 0.0;
  for (int64_t i = 0; i < dk; ++i) {
    const double ki = k[i];
    const float* row = state + i * dv;
    for (int64_t j = 0; j < dv; ++j) r[j] += (static_cast<double>(row[j]) * decay) * ki;
  }
  for (int64_t j = 0; j < dv; ++j) r[j] = beta * (v[j] - r[j]);  // r is now the update delta
  for (int64_t j = 0; j < dv; ++j) o[j] = 0.0;
  for (int64_t i = 0; i < dk; ++i) {
    const double ki = k[i], qi = q[i];
    float* row = state + i * dv;
    if (out) {
      S* out_row = out + i * dv;
      for (int64_t j = 0; j < dv; ++j) {
        const double x = static_cast<double>(row[j]) * decay + ki * r[j];
        o[j] += qi * x;
        out_row[j] = Round<S>(x);
        row[j] = static_cast<float>(ToDouble(out_row[j]));
      }
    } else {
      for (int64_t j = 0; j < dv; ++j) {
        const double x = static_cast<double>(row[j]) * decay + ki * r[j];
        o[j] += qi * x;
        row[j] = static_cast<float>(ToDouble(Round<S>(x)));
      }
    }
  }
  if (kDv > 0) {
    for (int64_t j = 0; j < dv; ++j) o_out[j] = o[j];
  }
}

template <typename T>
class Kernel {
 public:
  explicit Kernel(const GatedDeltaNetProblem& p) : p_(p) {
    const size_t rows = static_cast<size_t>(p.batch * p.seq);
    f_.q.resize(rows * p.key_dim());
    f_.k.resize(rows * p.key_dim());
    f_.v.resize(rows * p.value_dim());
    f_.g.resize(rows * p.num_v_heads);
    f_.beta.resize(rows * p.num_v_heads);
  }

  // Input x of channel c at token `pos` of batch b; pos < 0 reads the past conv state, whose last
  // position holds token -1.
  double ConvInput(int64_t b, int64_t c, int64_t pos) const {
    const int64_t C = p_.conv_dim(), L = p_.conv_state_len();
    if (pos >= 0) return ToDouble(static_cast<const T*>(p_.qkv)[(b * p_.seq + pos) * C + c]);
    return ToDouble(static_cast<const T*>(p_.past_conv)[(b * C + c) * L + (L + pos)]);
  }

  // Pass 1 is split per row (b, t) into parts, so that a decode step's one row still spreads over the
  // threads: part h < Hk is q head h, Hk + h k head h, 2 Hk + h v head h (with the row's gates in v head
  // 0's part). Every channel's value is computed as a whole-row pass computed it.
  int64_t FeatureParts() const { return 2 * p_.num_k_heads + p_.num_v_heads; }

  void TokenFeatures(int64_t task) {
    const int64_t parts = FeatureParts(), row = task / parts, part = task % parts;
    const int64_t kd = p_.key_dim(), vd = p_.value_dim(), dk = p_.k_head_dim, dv = p_.v_head_dim;
    const int64_t hk = p_.num_k_heads;
    thread_local std::vector<double> scratch;  // one head's channels (a part's only allocation, once per thread)
    if (scratch.size() < static_cast<size_t>(std::max(dk, dv))) scratch.resize(static_cast<size_t>(std::max(dk, dv)));
    double* conv = scratch.data();
    if (part < 2 * hk) {  // a q or k head: its channels, then their l2 norm
      const int64_t h = part % hk, first = (part < hk ? 0 : kd) + h * dk;
      ConvChannels(row, first, dk, conv);
      L2Normalize(conv, /*is_q=*/part < hk, &(part < hk ? f_.q : f_.k)[row * kd + h * dk]);
    } else {
      const int64_t h = part - 2 * hk;
      ConvChannels(row, 2 * kd + h * dv, dv, conv);
      for (int64_t i = 0; i < dv; ++i) f_.v[row * vd + h * dv + i] = static_cast<float>(conv[i]);
      if (h == 0) Gates(row);
    }
  }

  // Causal conv + SiLU of channels first .. first + n - 1 at row (b, t), each rounded to T.
  void ConvChannels(int64_t row, int64_t first, int64_t n, double* out) const {
    const int64_t b = row / p_.seq, t = row % p_.seq, K = p_.conv_kernel;
    const T* w = static_cast<const T*>(p_.conv_weight);
    const T* bias = static_cast<const T*>(p_.conv_bias);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = first + i;
      double acc = bias ? ToDouble(bias[c]) : 0.0;
      for (int64_t j = 0; j < K; ++j) acc += ToDouble(w[c * K + j]) * ConvInput(b, c, t - (K - 1) + j);
      out[i] = Rounded<T>(Silu(acc));
    }
  }

  // LpNormalization(p=2) of one head (x / sqrt(sum x^2 + l2norm_epsilon), a zero vector stays zero),
  // rounded to T; the q heads are then multiplied by scale and rounded again (the q_scaled Mul).
  void L2Normalize(const double* x, bool is_q, float* out) const {
    const int64_t dk = p_.k_head_dim;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < dk; ++i) sum_sq += x[i] * x[i];
    const double norm = std::sqrt(sum_sq + p_.l2norm_epsilon);
    for (int64_t i = 0; i < dk; ++i) {
      double y = norm > 0.0 ? Rounded<T>(x[i] / norm) : 0.0;
      if (is_q) y = Rounded<T>(y * static_cast<double>(p_.scale));
      out[i] = static_cast<float>(y);
    }
  }

  // LinearAttentionGate: g = neg_exp_A * softplus(a + dt_bias), beta = sigmoid(b), each rounded to T.
  void Gates(int64_t row) {
    const T* a = static_cast<const T*>(p_.a);
    const T* bgate = static_cast<const T*>(p_.b);
    for (int64_t h = 0; h < p_.num_v_heads; ++h) {
      const int64_t i = row * p_.num_v_heads + h;
      const double dt = gdn_cpu::LoadAny(p_.dt_bias, p_.dt_bias_type, h);
      const double neg_exp_a = gdn_cpu::LoadAny(p_.neg_exp_a, p_.neg_exp_a_type, h);
      f_.g[i] = static_cast<float>(Rounded<T>(neg_exp_a * Softplus(ToDouble(a[i]) + dt)));
      f_.beta[i] = static_cast<float>(Rounded<T>(Sigmoid(ToDouble(bgate[i]))));
    }
  }

  // Pass 3 for task (b, h), the recurrent state stored as float32 or as T (the op admits no other).
  void Recurrence(int64_t task) {
    if (p_.state_type == FloatType::kFloat32)
      Head<float>(task);
    else
      Head<T>(task);
  }

  // The gated delta rule of v head h over the call's tokens, and GatedRMSNorm of each output row.
  template <typename S>
  void Head(int64_t task) const {
    const int64_t b = task / p_.num_v_heads, h = task % p_.num_v_heads;
    const int64_t hk = h / (p_.num_v_heads / p_.num_k_heads);  // repeat_interleave, as HF and ORT
    const int64_t dk = p_.k_head_dim, dv = p_.v_head_dim, block = dk * dv;
    const S* past = static_cast<const S*>(p_.past_recurrent) + task * block;
    thread_local std::vector<float> state;  // values of S between tokens (DeltaRuleStep)
    thread_local std::vector<double> r, o;  // a task's only allocations, once per thread
    state.resize(static_cast<size_t>(block));
    r.resize(static_cast<size_t>(dv));
    o.resize(static_cast<size_t>(dv));
    for (int64_t e = 0; e < block; ++e) state[e] = static_cast<float>(ToDouble(past[e]));
    auto slot_out = [&](int64_t slot) {
      return static_cast<S*>(p_.present_recurrent) + (slot * p_.batch * p_.num_v_heads + task) * block;
    };
    for (int64_t slot = 0; slot < p_.slots - p_.seq; ++slot)  // before this call's first token
      gdn_cpu::ZeroSlot(slot_out(slot), sizeof(S) * block);

    for (int64_t t = 0; t < p_.seq; ++t) {
      const int64_t row = b * p_.seq + t;
      const float* q = &f_.q[row * p_.key_dim() + hk * dk];
      const float* k = &f_.k[row * p_.key_dim() + hk * dk];
      const float* v = &f_.v[row * p_.value_dim() + h * dv];
      const double decay = std::exp(static_cast<double>(f_.g[row * p_.num_v_heads + h]));
      const double beta = f_.beta[row * p_.num_v_heads + h];
      // The state as stored between calls (the next token starts from exactly that), into its slot.
      const int64_t slot = t - (p_.seq - p_.slots);
      S* out = slot >= 0 ? slot_out(slot) : nullptr;
      if (dv == 64) {  // Qwen3.5's small shapes
        DeltaRuleStep<S, 64>(state.data(), r.data(), o.data(), q, k, v, decay, beta, dk, dv, out);
      } else if (dv == 128) {  // Qwen3.5's large shapes
        DeltaRuleStep<S, 128>(state.data(), r.data(), o.data(), q, k, v, decay, beta, dk, dv, out);
      } else {
        DeltaRuleStep<S, 0>(state.data(), r.data(), o.data(), q, k, v, decay, beta, dk, dv, out);
      }
      GatedRmsNorm(row, h, o.data());
    }
  }

  // y = o * rsqrt(mean(o^2) + epsilon) * norm_weight * silu(z) over one v head, o first rounded to T
  // (LinearAttention's output tensor).
  void GatedRmsNorm(int64_t row, int64_t h, double* o) const {
    const int64_t dv = p_.v_head_dim, offset = row * p_.value_dim() + h * dv;
    const T* z = static_cast<const T*>(p_.z) + offset;
    const T* weight = static_cast<const T*>(p_.norm_weight);
    T* y = static_cast<T*>(p_.y) + offset;
    double sum_sq = 0.0;
    for (int64_t j = 0; j < dv; ++j) {
      o[j] = Rounded<T>(o[j]);
      sum_sq += o[j] * o[j];
    }
    const double inv_rms = 1.0 / std::sqrt(sum_sq / static_cast<double>(dv) + p_.epsilon);
    for (int64_t j = 0; j < dv; ++j) y[j] = Round<T>(o[j] * inv_rms * ToDouble(weight[j]) * Silu(ToDouble(z[j])));
  }

  const GatedDeltaNetProblem& p_;
  Features f_;
};

template <typename T>
void Run(const GatedDeltaNetProblem& p, ParallelFor parallel_for, void* context) {
  Kernel<T> kernel(p);
  cpu::ForEach<Kernel<T>, &Kernel<T>::TokenFeatures>(kernel, p.batch * p.seq * kernel.FeatureParts(), parallel_for,
                                                      context);
  // Only once pass 1 has read every past conv state: present_conv may alias it.
  for (int64_t b = 0; b < p.batch; ++b) gdn_cpu::ConvStates<T>(p, b);
  cpu::ForEach<Kernel<T>, &Kernel<T>::Recurrence>(kernel, p.batch * p.num_v_heads, parallel_for, context);
}

}  // namespace

void GatedDeltaNetCpuReference(const GatedDeltaNetProblem& p, ParallelFor parallel_for, void* parallel_context) {
  cpu::WithElementType(p.type, [&](auto t) { Run<decltype(t)>(p, parallel_for, parallel_context); });
}

}  // namespace ort_mtp
