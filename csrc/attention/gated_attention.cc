// GatedAttention: a Qwen3.5 gated full-attention mixer in one node, from qkv_proj's output to o_proj's
// input (ops/gated_attention.py rewrites the builder's ~16 nodes into it on the CPU). Per token (b, s):
//   qkv [B, S, 2 Nq H + 2 Nkv H] holds, per q head h, H query features then H gate features, then the
//   Nkv key heads, then the Nkv value heads (the builder's packed q|gate, k, v projection);
//   q_h = rope(rms(q_h) * q_norm_weight), k_j = rope(rms(k_j) * k_norm_weight), each rounded to T;
//   (attn, present_key, present_value) = GroupQueryAttention(q, k, v, past_key, past_value, seqlens_k,
//     total_sequence_length): the same check and kernel as ort_mtp::GroupQueryAttention (gqa_node.h);
//   output[b, s, h H + i] = T(attn * sigmoid(gate_h[i])).
// rms(x) = x / sqrt(mean(x^2) + epsilon) over one head's H features; rope is com.microsoft::
// MRotaryEmbedding's (non-interleaved halves, the first rotary_embedding_dim features, each frequency
// column's cos/sin taken at the position of the stream (t, h, w) that mrope_section and mrope_layout
// assign it, as ORT's ComputeDimAssignments does); every step is computed in double from the T values
// the graph's nodes would hand each other and rounded to T where a node of the graph writes a tensor.
// Nothing in a token's arithmetic depends on the other tokens of the call, and the attention's query rows
// do not depend on the width (group_query_attention.h), so a width-S call is S width-1 calls bit for bit.
//
// Every check runs on every call (shapes, types, position ids against the cos/sin caches, seqlens_k
// against the KV cache), so no model or input makes the kernel read or write out of bounds; each failure
// is an ORT error naming the node. On CUDA (gated_attention_cuda.cu) position ids and seqlens_k live on
// the device and are checked there (NaN rows instead of an error); ORT_MTP_GATED_ATTENTION_CUDA=0 leaves
// that kernel out, and CUDA models then keep the builder's nodes (the rewrite asks the library).
#include <algorithm>
#include <array>
#include <iterator>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attention/gated_attention.h"
#include "attention/gqa_node.h"
#include "common/cpu_numeric.h"
#include "common/validate.h"
#include "ops.h"

namespace ort_mtp {
namespace {

using cpu::Round;
using cpu::ToDouble;

constexpr const char* kOpName = "GatedAttention";
enum Input {
  kQkv = 0, kPastKey, kPastValue, kSeqlensK, kTotalSeqLen, kPositionIds, kCosCache, kSinCache, kQNormWeight,
  kKNormWeight, kInputCount
};
constexpr const char* kInputNames[kInputCount] = {
    "qkv", "past_key", "past_value", "seqlens_k", "total_sequence_length", "position_ids", "cos_cache",
    "sin_cache", "q_norm_weight", "k_norm_weight"};
constexpr int kOutputCount = 3;
constexpr const char* kOutputNames[kOutputCount] = {"output", "present_key", "present_value"};
constexpr int64_t kMaxRotary = 1 << 14;

std::string InputLabel(int i) { return std::string("input ") + kInputNames[i]; }

struct Attrs {
  GqaAttrs gqa;
  float epsilon = 0.f;
  int64_t rotary_dim = 0;  // 0: the head size
  std::array<int64_t, 3> mrope_section{};
  int64_t mrope_layout = 0;  // 0: sectioned (t, then h, then w columns), 1: interleaved (h, w every 3rd)
};

Attrs ReadAttrs(const Ort::ConstKernelInfo& info, const std::string& where) {
  Attrs a;
  a.gqa = ReadGqaAttrs(info, where);
  a.epsilon = FloatAttr(info, where, "epsilon", 1e-6f, 0.f);
  a.rotary_dim = IntAttr(info, where, "rotary_embedding_dim", 0, kMaxRotary, 0);
  if (a.rotary_dim % 2) Fail(where, "attribute rotary_embedding_dim must be even, got " + std::to_string(a.rotary_dim));
  if (IntAttr(info, where, "interleaved", 0, 1, 0) != 0)
    Fail(where, "interleaved=1 (rotary on adjacent pairs) is not supported (0: the two halves)", ORT_NOT_IMPLEMENTED);
  const std::vector<int64_t> section = IntsAttr(info, where, "mrope_section");
  if (section.size() != 3) Fail(where, "attribute mrope_section must hold 3 values, got " + std::to_string(section.size()));
  for (int i = 0; i < 3; ++i) {
    if (section[i] < 0 || section[i] > kMaxRotary)
      Fail(where, "attribute mrope_section's values must be in [0, " + std::to_string(kMaxRotary) + "]");
    a.mrope_section[i] = section[i];
  }
  a.mrope_layout = IntAttr(info, where, "mrope_layout", 0, 1, 0);
  return a;
}

// Which position stream (0 = t, 1 = h, 2 = w) gives each of the `half` cos/sin columns: ORT's
// MRotaryEmbedding (mrotary_embedding_helper.h, ComputeDimAssignments).
std::vector<int> StreamOfColumn(const Attrs& a, int64_t half) {
  std::vector<int> stream(static_cast<size_t>(half), 0);
  if (a.mrope_layout == 0) {
    int64_t pos = 0;
    for (int dim = 0; dim < 3; ++dim)
      for (int64_t i = 0; i < a.mrope_section[dim] && pos < half; ++i, ++pos) stream[pos] = dim;
  } else {
    for (int dim = 1; dim < 3; ++dim)
      for (int64_t i = dim; i < 3 * a.mrope_section[dim] && i < half; i += 3) stream[i] = dim;
  }
  return stream;
}

struct Shape {
  int64_t B = 0, S = 0, H = 0, rot = 0, max_pos = 0;
};

// One token's q or k head: rms norm with `weight`, rounded to T, then rope with the token's cos/sin
// columns, rounded to T, into `out` (H values).
template <typename T>
void NormRope(const T* x, const T* weight, int64_t H, int64_t rot, double epsilon, const double* cos,
              const double* sin, T* out, double* tmp) {
  double squares = 0.0;
  for (int64_t i = 0; i < H; ++i) squares += ToDouble(x[i]) * ToDouble(x[i]);
  const double inv = 1.0 / std::sqrt(squares / static_cast<double>(H) + epsilon);
  for (int64_t i = 0; i < H; ++i) tmp[i] = cpu::Rounded<T>(ToDouble(x[i]) * inv * ToDouble(weight[i]));
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = Round<T>(tmp[i] * cos[i] - tmp[i + half] * sin[i]);
    out[i + half] = Round<T>(tmp[i + half] * cos[i] + tmp[i] * sin[i]);
  }
  for (int64_t i = rot; i < H; ++i) out[i] = Round<T>(tmp[i]);
}

template <typename T>
struct Kernel {
  const Attrs& a;
  const Shape& d;
  const std::vector<int>& stream_of_column;

  // q, k (normed, roped) and v of every token into their [B, S, heads * H] buffers.
  void Prepare(const T* qkv, const int64_t* positions, const float* cos_cache, const float* sin_cache,
               const T* q_weight, const T* k_weight, T* q, T* k, T* v) const {
    const int64_t Nq = a.gqa.num_heads, Nkv = a.gqa.kv_num_heads, H = d.H, half = d.rot / 2;
    const int64_t width = 2 * (Nq + Nkv) * H;
    std::vector<double> cos(static_cast<size_t>(half)), sin(static_cast<size_t>(half)), tmp(static_cast<size_t>(H));
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t s = 0; s < d.S; ++s) {
        const int64_t token = b * d.S + s;
        for (int64_t c = 0; c < half; ++c) {
          const int64_t pos = positions[stream_of_column[c] * d.B * d.S + token];
          cos[c] = cos_cache[pos * half + c];
          sin[c] = sin_cache[pos * half + c];
        }
        const T* row = qkv + token * width;
        for (int64_t h = 0; h < Nq; ++h)
          NormRope(row + h * 2 * H, q_weight, H, d.rot, a.epsilon, cos.data(), sin.data(), q + (token * Nq + h) * H,
                   tmp.data());
        const T* keys = row + 2 * Nq * H;
        for (int64_t h = 0; h < Nkv; ++h)
          NormRope(keys + h * H, k_weight, H, d.rot, a.epsilon, cos.data(), sin.data(), k + (token * Nkv + h) * H,
                   tmp.data());
        std::memcpy(v + token * Nkv * H, keys + Nkv * H, static_cast<size_t>(Nkv * H) * sizeof(T));
      }
  }

  // output = T(attn * sigmoid(gate)), in place.
  void Gate(const T* qkv, T* out) const {
    const int64_t Nq = a.gqa.num_heads, Nkv = a.gqa.kv_num_heads, H = d.H;
    const int64_t width = 2 * (Nq + Nkv) * H;
    for (int64_t token = 0; token < d.B * d.S; ++token)
      for (int64_t h = 0; h < Nq; ++h) {
        const T* gate = qkv + token * width + h * 2 * H + H;
        T* o = out + (token * Nq + h) * H;
        for (int64_t i = 0; i < H; ++i) o[i] = Round<T>(ToDouble(o[i]) / (1.0 + std::exp(-ToDouble(gate[i]))));
      }
  }
};

struct GatedAttentionKernel {
  GatedAttentionKernel(const OrtKernelInfo* raw_info, FloatType type, bool cuda) : type_(type), cuda_(cuda) {
    Ort::ConstKernelInfo info{raw_info};
    where_ = NodeLabel(kOpName, info.GetNodeName());
    attrs_ = ReadAttrs(info, where_);
    CheckNodeArity(info, where_, {std::begin(kInputNames), std::end(kInputNames)},
                   {std::begin(kOutputNames), std::end(kOutputNames)});
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) {
    return Guard(where_, [&] { Compute(raw_ctx); });
  }

  Shape CheckInputs(const std::array<TensorDesc, kInputCount>& in) const {
    const ONNXTensorElementDataType t = OnnxType(type_);
    auto need_type = [&](int i, ONNXTensorElementDataType want) {
      if (in[i].type != want) Fail(where_, InputLabel(i) + " is " + TypeName(in[i].type) + ", expected " + TypeName(want));
    };
    need_type(kQkv, t);
    need_type(kPositionIds, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
    need_type(kCosCache, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
    need_type(kSinCache, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
    need_type(kQNormWeight, t);
    need_type(kKNormWeight, t);
    Shape d;
    const TensorDesc& qkv = in[kQkv];
    const int64_t heads = 2 * (attrs_.gqa.num_heads + attrs_.gqa.kv_num_heads);
    if (qkv.shape.size() != 3 || qkv.shape[2] == 0 || qkv.shape[2] % heads != 0)
      Fail(where_, "input qkv has shape " + ShapeToString(qkv.shape) +
                       ", expected [B, S, 2 (num_heads + kv_num_heads) head_size] = [B, S, " + std::to_string(heads) +
                       " x head_size]");
    d.B = qkv.shape[0];
    d.S = qkv.shape[1];
    d.H = qkv.shape[2] / heads;
    if (d.S < 1) Fail(where_, "input qkv has shape " + ShapeToString(qkv.shape) + ": a call needs at least 1 token");
    d.rot = attrs_.rotary_dim > 0 ? attrs_.rotary_dim : d.H;
    if (d.rot > d.H)
      Fail(where_, "rotary_embedding_dim " + std::to_string(d.rot) + " exceeds the head size " + std::to_string(d.H));
    if (d.rot % 2) Fail(where_, "the rotary dimension (the head size " + std::to_string(d.H) + ") must be even");
    const int64_t sum = attrs_.mrope_section[0] + attrs_.mrope_section[1] + attrs_.mrope_section[2];
    if (sum != d.rot / 2)
      Fail(where_, "mrope_section sums to " + std::to_string(sum) + ", not rotary_embedding_dim / 2 = " +
                       std::to_string(d.rot / 2));
    ort_mtp::CheckShape(where_, InputLabel(kQNormWeight), in[kQNormWeight], {d.H}, "[head_size]");
    ort_mtp::CheckShape(where_, InputLabel(kKNormWeight), in[kKNormWeight], {d.H}, "[head_size]");
    ort_mtp::CheckShape(where_, InputLabel(kPositionIds), in[kPositionIds], {3, d.B, d.S}, "[3, B, S]");
    ort_mtp::CheckShape(where_, InputLabel(kCosCache), in[kCosCache], {-1, d.rot / 2}, "[max_position, rotary / 2]");
    if (in[kSinCache].shape != in[kCosCache].shape)
      Fail(where_, "input sin_cache has shape " + ShapeToString(in[kSinCache].shape) + ", cos_cache " +
                       ShapeToString(in[kCosCache].shape) + ": they must match");
    d.max_pos = in[kCosCache].shape[0];
    return d;
  }

  void Compute(OrtKernelContext* raw_ctx) {
    Ort::KernelContext ctx{raw_ctx};
    CheckCallArity(ctx, where_, kInputCount, kOutputCount);
    std::array<Ort::ConstValue, kInputCount> values;
    std::array<TensorDesc, kInputCount> in;
    for (int i = 0; i < kInputCount; ++i) {
      values[i] = ctx.GetInput(i);
      in[i] = Describe(values[i]);
      if (!in[i].present) Fail(where_, InputLabel(i) + " is required");
    }
    const Shape d = CheckInputs(in);
    const int64_t* positions = values[kPositionIds].GetTensorData<int64_t>();
    if (cuda_) {
      ComputeCuda(ctx, values, d);
      return;
    }
    for (int64_t i = 0; i < 3 * d.B * d.S; ++i)
      if (positions[i] < 0 || positions[i] >= d.max_pos)
        Fail(where_, "position_ids holds " + std::to_string(positions[i]) + " (stream " + std::to_string(i / (d.B * d.S)) +
                         "), outside the cos/sin caches' [0, " + std::to_string(d.max_pos) + ")");

    // The attention's query, key and value, made here and checked with the rest by PrepareGqa.
    const int64_t Nq = attrs_.gqa.num_heads, Nkv = attrs_.gqa.kv_num_heads;
    const size_t elem = TypeSize(OnnxType(type_));
    static thread_local std::vector<uint8_t> q_buf, k_buf, v_buf;
    q_buf.resize(static_cast<size_t>(d.B * d.S * Nq * d.H) * elem);
    k_buf.resize(static_cast<size_t>(d.B * d.S * Nkv * d.H) * elem);
    v_buf.resize(k_buf.size());
    GqaInputs gqa = AttentionInputs(values, d);
    gqa.data[0] = q_buf.data();
    gqa.data[1] = k_buf.data();
    gqa.data[2] = v_buf.data();
    const GroupQueryAttentionProblem p = PrepareGqa(ctx, where_, attrs_.gqa, type_, gqa, false);
    if (p.batch == 0) return;

    const std::vector<int> streams = StreamOfColumn(attrs_, d.rot / 2);
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const Kernel<T> kernel{attrs_, d, streams};
      const T* qkv = static_cast<const T*>(values[kQkv].GetTensorRawData());
      kernel.Prepare(qkv, positions, values[kCosCache].GetTensorData<float>(), values[kSinCache].GetTensorData<float>(),
                     static_cast<const T*>(values[kQNormWeight].GetTensorRawData()),
                     static_cast<const T*>(values[kKNormWeight].GetTensorRawData()), reinterpret_cast<T*>(q_buf.data()),
                     reinterpret_cast<T*>(k_buf.data()), reinterpret_cast<T*>(v_buf.data()));
      RunGqaCpu(ctx, p);
      kernel.Gate(qkv, static_cast<T*>(p.output));
    };
    cpu::WithElementType(type_, run);
  }

  // GroupQueryAttention's inputs: the query, key and value this op makes from qkv (described here; their
  // data is the caller's) and the node's cache inputs, for PrepareGqa to check with the rest.
  GqaInputs AttentionInputs(const std::array<Ort::ConstValue, kInputCount>& values, const Shape& d) const {
    GqaInputs gqa;
    const ONNXTensorElementDataType t = OnnxType(type_);
    gqa.desc[0] = {true, {d.B, d.S, attrs_.gqa.num_heads * d.H}, t};
    gqa.desc[1] = gqa.desc[2] = {true, {d.B, d.S, attrs_.gqa.kv_num_heads * d.H}, t};
    for (int i = 3; i < kGqaInputCount; ++i) gqa.Set(i, values[kPastKey + i - 3]);
    return gqa;
  }

  // The CUDA path: the same checks of shapes and of the attention's inputs, then the kernel.
  void ComputeCuda(Ort::KernelContext& ctx, const std::array<Ort::ConstValue, kInputCount>& values, const Shape& d) {
    GqaInputs gqa = AttentionInputs(values, d);
    GatedAttentionProblem p;
    p.gqa = PrepareGqa(ctx, where_, attrs_.gqa, type_, gqa, true);
    if (p.gqa.batch == 0) return;
#ifdef ORT_MTP_WITH_CUDA
    p.qkv = values[kQkv].GetTensorRawData();
    p.position_ids = values[kPositionIds].GetTensorData<int64_t>();
    p.cos_cache = values[kCosCache].GetTensorData<float>();
    p.sin_cache = values[kSinCache].GetTensorData<float>();
    p.q_norm_weight = values[kQNormWeight].GetTensorRawData();
    p.k_norm_weight = values[kKNormWeight].GetTensorRawData();
    p.rotary_dim = d.rot;
    p.max_position = d.max_pos;
    for (int i = 0; i < 3; ++i) p.mrope_section[i] = attrs_.mrope_section[i];
    p.mrope_layout = static_cast<int>(attrs_.mrope_layout);
    p.epsilon = attrs_.epsilon;
    if (const char* error = GatedAttentionCuda(p, ctx.GetGPUComputeStream())) Fail(where_, error, ORT_FAIL);
#else
    Fail(where_, "this library was built without CUDA kernels", ORT_NOT_IMPLEMENTED);
#endif
  }

  std::string where_;
  Attrs attrs_;
  FloatType type_;
  bool cuda_;
};

template <FloatType kType, bool kCuda>
struct GatedAttentionOp : Ort::CustomOpBase<GatedAttentionOp<kType, kCuda>, GatedAttentionKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return Guard(kOpName, [&] { *kernel = new GatedAttentionKernel(info, kType, kCuda); });
  }
  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return kCuda ? "CUDAExecutionProvider" : "CPUExecutionProvider"; }
  // total_sequence_length sizes present, so the host reads it (as GroupQueryAttention's).
  OrtMemType GetInputMemoryType(size_t index) const {
    return index == kTotalSeqLen ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  }
  size_t GetInputTypeCount() const { return kInputCount; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    switch (index) {
      case kSeqlensK:
      case kTotalSeqLen: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
      case kPositionIds: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
      case kCosCache:
      case kSinCache: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
      default: return OnnxType(kType);
    }
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }
  size_t GetOutputTypeCount() const { return kOutputCount; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return OnnxType(kType); }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }
};

}  // namespace

// The CPU classes always; the CUDA classes in a CUDA build unless ORT_MTP_GATED_ATTENTION_CUDA=0 (then CUDA
// models keep the builder's nodes: the rewrite asks the library which kernels it has, ops/gated_attention.py).
// The CUDA kernel passes its GPU group (tests/gpu, gated-attention: against this CPU op, widths 1..16
// bit-identical to width-1 calls) under memcheck, and the 27B-class folder's MTP streams equal greedy's with
// it (bench/results/2026-12-05-gated-attention-cuda).
void AddGatedAttentionOps(Ort::CustomOpDomain& domain, bool with_cuda) {
  AddFloatTypedOps<GatedAttentionOp>(domain, with_cuda && CudaKernelSwitch("ORT_MTP_GATED_ATTENTION_CUDA", true));
}

}  // namespace ort_mtp
