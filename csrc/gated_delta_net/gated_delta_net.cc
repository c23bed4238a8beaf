// The GatedDeltaNet custom op: attribute, type and shape validation, and dispatch to the CPU kernel or
// the CUDA kernel (GatedDeltaNetCuda, gated_delta_net.h). One op class per activation type T, gate
// parameter type and EP; ONNX Runtime merges them into one schema with the union of their type
// constraints.
//
// Every check runs on every call, and the ones that need only the attributes and the constant inputs
// (the weights) also at session creation, so that a bad model fails to load. No size the kernel uses
// comes from anywhere but a checked shape, so no model or input can make it read or write out of
// bounds; each failure is an ORT error naming the node.
#include "gated_delta_net/gated_delta_net.h"

#include <array>
#include <iterator>
#include <cmath>
#include <string>
#include <vector>

#include "common/validate.h"
#include "ops.h"

namespace ort_mtp {
namespace {

constexpr const char* kOpName = "GatedDeltaNet";

enum Input {
  kQkv = 0, kZ, kA, kB, kConvWeight, kConvBias, kDtBias, kNegExpA, kNormWeight, kPastConv, kPastRecurrent,
  kInputCount
};
enum Output { kY = 0, kPresentConv, kPresentRecurrent, kOutputCount };
constexpr const char* kInputNames[kInputCount] = {"qkv", "z", "a", "b", "conv_weight", "conv_bias", "dt_bias",
                                                  "neg_exp_A", "norm_weight", "past_conv", "past_recurrent"};
constexpr const char* kOutputNames[kOutputCount] = {"y", "present_conv", "present_recurrent"};

// Bounds that keep every product of attributes (conv_dim, dk * dv, ...) far from int64 overflow, so a
// shape check cannot pass by wrapping around. They are far above any real model's.
constexpr int64_t kMaxHeads = 1 << 16;
constexpr int64_t kMaxHeadDim = 1 << 16;
constexpr int64_t kMaxKernel = 256;
constexpr int64_t kMaxStateWindow = 64;

struct Attrs {
  int64_t hk = 0, hv = 0, dk = 0, dv = 0, window = 0;
  float scale = 0.f, epsilon = 0.f, l2norm_epsilon = 0.f;
  int64_t key_dim() const { return hk * dk; }
  int64_t value_dim() const { return hv * dv; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// 1/sqrt(dk) as the builder's q_scaled constant holds it: computed in double, rounded to float32
// and then to T.
float DefaultScale(int64_t dk, FloatType type) {
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  switch (type) {
    case FloatType::kFloat32: return s;
    case FloatType::kFloat16: return Ort::Float16_t(s).ToFloat();
    case FloatType::kBFloat16: return Ort::BFloat16_t(s).ToFloat();
  }
  return s;
}

Attrs ReadAttrs(const Ort::ConstKernelInfo& info, const std::string& where, FloatType type) {
  Attrs a;
  a.hk = IntAttr(info, where, "num_k_heads", 1, kMaxHeads);
  a.hv = IntAttr(info, where, "num_v_heads", 1, kMaxHeads);
  a.dk = IntAttr(info, where, "k_head_dim", 1, kMaxHeadDim);
  a.dv = IntAttr(info, where, "v_head_dim", 1, kMaxHeadDim);
  a.window = IntAttr(info, where, "state_window", 0, kMaxStateWindow, 0);
  if (a.hv % a.hk != 0)
    Fail(where, "num_v_heads (" + std::to_string(a.hv) + ") must be a multiple of num_k_heads (" +
                    std::to_string(a.hk) + "): each q/k head serves num_v_heads / num_k_heads v heads");
  a.scale = FloatAttr(info, where, "scale", DefaultScale(a.dk, type), -INFINITY);
  a.epsilon = FloatAttr(info, where, "epsilon", 1e-5f, 0.f);  // GatedRMSNorm's default
  a.l2norm_epsilon = FloatAttr(info, where, "l2norm_epsilon", 0.f, 0.f);
  return a;
}

// ---------------------------------------------------------------------------------------------------
// Inputs: shapes and types, checked against the attributes and each other.


using InputDescs = std::array<TensorDesc, kInputCount>;

// The extents the attributes do not fix: batch B and sequence S (from qkv) and conv kernel K (from
// conv_weight); -1 while unknown (at session creation, or before the input that gives it is checked).
struct Dims {
  int64_t B = -1, S = -1, K = -1;
};

std::string InputLabel(int i) { return std::string("input ") + kInputNames[i]; }

// shape must equal `expected`, where -1 matches any extent; `form` names the dimensions.
void CheckShape(const std::string& where, int i, const TensorDesc& d, const std::vector<int64_t>& expected,
                const char* form) {
  ort_mtp::CheckShape(where, InputLabel(i), d, expected, form);
}

void CheckType(const std::string& where, int i, const TensorDesc& d, FloatType type, bool or_float32) {
  const ONNXTensorElementDataType t = OnnxType(type);
  if (d.type == t || (or_float32 && d.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)) return;
  Fail(where, InputLabel(i) + " is " + TypeName(d.type) + ", expected " + TypeName(t) +
                  (or_float32 && type != FloatType::kFloat32 ? " or float32" : ""));
}

// Checks every present input; returns the extents they fix.
Dims CheckInputs(const std::string& where, const Attrs& at, FloatType type, const InputDescs& in) {
  Dims d;
  const int64_t C = at.conv_dim(), W = at.window;
  for (int i = 0; i < kInputCount; ++i) {
    if (!in[i].present) continue;
    const bool or_float32 = i == kDtBias || i == kNegExpA || i == kPastRecurrent;
    CheckType(where, i, in[i], type, or_float32);
  }
  if (in[kQkv].present) {
    CheckShape(where, kQkv, in[kQkv], {-1, -1, C}, "[B, S, 2 * num_k_heads * k_head_dim + num_v_heads * v_head_dim]");
    d.B = in[kQkv].shape[0];
    d.S = in[kQkv].shape[1];
    if (d.S < 1)
      Fail(where, "input qkv has shape " + ShapeToString(in[kQkv].shape) + ": a call needs at least 1 token");
  }
  if (in[kConvWeight].present) {
    CheckShape(where, kConvWeight, in[kConvWeight], {C, 1, -1}, "[conv_dim, 1, K]");
    d.K = in[kConvWeight].shape[2];
    if (d.K < 1 || d.K > kMaxKernel)
      Fail(where, "input conv_weight has kernel size K=" + std::to_string(d.K) + "; K must be in [1, " +
                      std::to_string(kMaxKernel) + "]");
  }
  const int64_t L = d.K < 0 ? -1 : d.K - 1;
  auto check = [&](int i, const std::vector<int64_t>& expected, const char* form) {
    if (in[i].present) CheckShape(where, i, in[i], expected, form);
  };
  check(kZ, {d.B, d.S, at.value_dim()}, "[B, S, num_v_heads * v_head_dim]");
  check(kA, {d.B, d.S, at.hv}, "[B, S, num_v_heads]");
  check(kB, {d.B, d.S, at.hv}, "[B, S, num_v_heads]");
  check(kConvBias, {C}, "[conv_dim]");
  check(kDtBias, {at.hv}, "[num_v_heads]");
  check(kNegExpA, {at.hv}, "[num_v_heads]");
  check(kNormWeight, {at.dv}, "[v_head_dim]");
  if (W == 0) {
    check(kPastConv, {d.B, C, L}, "[B, conv_dim, K - 1] (state_window 0)");
    check(kPastRecurrent, {d.B, at.hv, at.dk, at.dv}, "[B, num_v_heads, k_head_dim, v_head_dim] (state_window 0)");
  } else {
    check(kPastConv, {W, d.B, C, L}, "[state_window, B, conv_dim, K - 1]");
    check(kPastRecurrent, {W, d.B, at.hv, at.dk, at.dv}, "[state_window, B, num_v_heads, k_head_dim, v_head_dim]");
  }
  return d;
}

FloatType StateType(ONNXTensorElementDataType t, FloatType type) {
  return t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? FloatType::kFloat32 : type;  // CheckType admitted T or float32
}

// ---------------------------------------------------------------------------------------------------
// The kernel. kCuda selects the EP (the CUDA classes are registered in CUDA builds only).

template <bool kCuda>
struct GatedDeltaNetKernel {
  GatedDeltaNetKernel(const OrtKernelInfo* raw_info, FloatType type) : type_(type) {
    Ort::ConstKernelInfo info{raw_info};
    where_ = NodeLabel(kOpName, info.GetNodeName());
    attrs_ = ReadAttrs(info, where_, type_);
    CheckNodeArity(info, where_, {std::begin(kInputNames), std::end(kInputNames)},
                   {std::begin(kOutputNames), std::end(kOutputNames)}, kConvBias);
    // The weights are initializers in every real model: check them now, so a bad one fails at load.
    InputDescs constants;
    for (int i : {kConvWeight, kConvBias, kDtBias, kNegExpA, kNormWeight}) {
      if (info.GetInputName(i).empty()) continue;
      int is_constant = 0;
      Ort::ConstValue v = info.GetTensorConstantInput(i, &is_constant);
      if (is_constant) constants[i] = Describe(v);
    }
    CheckInputs(where_, attrs_, type_, constants);
#ifdef ORT_MTP_WITH_CUDA
    // Head dims the CUDA kernel does not take: refused now, so the model fails to load on the CUDA EP.
    if constexpr (kCuda) {
      if (const char* why = GatedDeltaNetCudaUnsupported(attrs_.dk, attrs_.dv))
        Fail(where_, std::string(why) + " (k_head_dim " + std::to_string(attrs_.dk) + ", v_head_dim " +
                         std::to_string(attrs_.dv) + "); run this node on the CPU EP",
             ORT_NOT_IMPLEMENTED);
    }
#endif
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) {
    return Guard(where_, [&] { Compute(raw_ctx); });
  }

  // ORT sizes an output buffer from its declared type; present_recurrent's type is not fixed by the
  // schema (T or float32, as past_recurrent), so a graph could declare a narrower one than this op
  // writes. Every output must have the type and shape the op computes.
  void CheckOutput(int i, const Ort::UnownedValue& out, ONNXTensorElementDataType type,
                   const std::vector<int64_t>& shape) const {
    ort_mtp::CheckOutput(where_, std::string("output ") + kOutputNames[i], out, type, shape,
                         i == kPresentRecurrent ? " (present_recurrent has past_recurrent's type)" : "");
  }

  void Compute(OrtKernelContext* raw_ctx) {
    Ort::KernelContext ctx{raw_ctx};
    CheckCallArity(ctx, where_, kInputCount, kOutputCount);
    std::array<Ort::ConstValue, kInputCount> values;
    InputDescs in;
    for (int i = 0; i < kInputCount; ++i) {
      values[i] = ctx.GetInput(i);
      in[i] = Describe(values[i]);
      if (!in[i].present && i != kConvBias) Fail(where_, InputLabel(i) + " is required");
    }
    const Dims d = CheckInputs(where_, attrs_, type_, in);

    Ort::UnownedValue y = ctx.GetOutput(kY, {d.B, d.S, attrs_.value_dim()});
    Ort::UnownedValue conv = ctx.GetOutput(kPresentConv, in[kPastConv].shape);
    Ort::UnownedValue rec = ctx.GetOutput(kPresentRecurrent, in[kPastRecurrent].shape);
    CheckOutput(kY, y, OnnxType(type_), {d.B, d.S, attrs_.value_dim()});
    CheckOutput(kPresentConv, conv, OnnxType(type_), in[kPastConv].shape);
    CheckOutput(kPresentRecurrent, rec, in[kPastRecurrent].type, in[kPastRecurrent].shape);
    if (d.B == 0) return;  // empty batch: empty outputs

    GatedDeltaNetProblem p = Problem(d, in);
    auto data = [&](int i) { return values[i] ? values[i].GetTensorRawData() : nullptr; };
    p.qkv = data(kQkv);
    p.z = data(kZ);
    p.a = data(kA);
    p.b = data(kB);
    p.conv_weight = data(kConvWeight);
    p.conv_bias = data(kConvBias);
    p.dt_bias = data(kDtBias);
    p.neg_exp_a = data(kNegExpA);
    p.norm_weight = data(kNormWeight);
    p.past_conv = ReadSlot(data(kPastConv), in[kPastConv]);
    p.past_recurrent = ReadSlot(data(kPastRecurrent), in[kPastRecurrent]);
    p.y = y.GetTensorMutableRawData();
    p.present_conv = conv.GetTensorMutableRawData();
    p.present_recurrent = rec.GetTensorMutableRawData();

    if constexpr (kCuda) {
#ifdef ORT_MTP_WITH_CUDA
      if (const char* error = GatedDeltaNetCuda(p, ctx.GetGPUComputeStream())) Fail(where_, error, ORT_FAIL);
#endif
      return;
    }
    GatedDeltaNetCpu(p, KernelParallelFor, &ctx);
  }

  // The past slot a call starts from: W - 1, the only one read (the whole tensor when unwindowed).
  const void* ReadSlot(const void* data, const TensorDesc& past) const {
    if (attrs_.window == 0) return data;
    const size_t slot_bytes = static_cast<size_t>(ElementCount(past.shape) / attrs_.window) * TypeSize(past.type);
    return static_cast<const char*>(data) + (attrs_.window - 1) * slot_bytes;
  }

  // The problem's sizes and types (its pointers are filled in by Compute).
  GatedDeltaNetProblem Problem(const Dims& d, const InputDescs& in) const {
    GatedDeltaNetProblem p;
    p.batch = d.B;
    p.seq = d.S;
    p.num_k_heads = attrs_.hk;
    p.num_v_heads = attrs_.hv;
    p.k_head_dim = attrs_.dk;
    p.v_head_dim = attrs_.dv;
    p.conv_kernel = d.K;
    p.slots = attrs_.window > 0 ? attrs_.window : 1;
    p.scale = attrs_.scale;
    p.epsilon = attrs_.epsilon;
    p.l2norm_epsilon = attrs_.l2norm_epsilon;
    p.type = type_;
    p.state_type = StateType(in[kPastRecurrent].type, type_);
    p.dt_bias_type = StateType(in[kDtBias].type, type_);
    p.neg_exp_a_type = StateType(in[kNegExpA].type, type_);
    return p;
  }

  std::string where_;
  Attrs attrs_;
  FloatType type_;
};

// One class per (T, gate parameter type): dt_bias and neg_exp_A are both float32 (the builder's) or
// both T. past_recurrent is the schema's one dynamically typed input (T or float32, checked per call),
// so ORT gives present_recurrent its type; every other input and output is typed.
template <FloatType kType, FloatType kGateType, bool kCuda>
struct GatedDeltaNetOp
    : Ort::CustomOpBase<GatedDeltaNetOp<kType, kGateType, kCuda>, GatedDeltaNetKernel<kCuda>, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return Guard(kOpName, [&] { *kernel = new GatedDeltaNetKernel<kCuda>(info, kType); });
  }
  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return kCuda ? "CUDAExecutionProvider" : "CPUExecutionProvider"; }

  size_t GetInputTypeCount() const { return kInputCount; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    switch (index) {
      case kDtBias:
      case kNegExpA: return OnnxType(kGateType);
      case kPastRecurrent: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
      default: return OnnxType(kType);
    }
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == kConvBias ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return kOutputCount; }
  ONNXTensorElementDataType GetOutputType(size_t index) const {
    return index == kPresentRecurrent ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : OnnxType(kType);
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }
};

}  // namespace

// The CPU classes always; the CUDA classes in a CUDA build (as MatMulNBits' and CopySlots').
void AddGatedDeltaNetOps(Ort::CustomOpDomain& domain, bool with_cuda) {
  constexpr FloatType f32 = FloatType::kFloat32, f16 = FloatType::kFloat16, bf16 = FloatType::kBFloat16;
  static GatedDeltaNetOp<f32, f32, false> cpu_f32;
  static GatedDeltaNetOp<f16, f32, false> cpu_f16;
  static GatedDeltaNetOp<f16, f16, false> cpu_f16_f16_gates;
  static GatedDeltaNetOp<bf16, f32, false> cpu_bf16;
  static GatedDeltaNetOp<bf16, bf16, false> cpu_bf16_bf16_gates;
  domain.Add(&cpu_f32);
  domain.Add(&cpu_f16);
  domain.Add(&cpu_f16_f16_gates);
  domain.Add(&cpu_bf16);
  domain.Add(&cpu_bf16_bf16_gates);
#ifdef ORT_MTP_WITH_CUDA
  if (with_cuda) {
    static GatedDeltaNetOp<f32, f32, true> cuda_f32;
    static GatedDeltaNetOp<f16, f32, true> cuda_f16;
    static GatedDeltaNetOp<f16, f16, true> cuda_f16_f16_gates;
    static GatedDeltaNetOp<bf16, f32, true> cuda_bf16;
    static GatedDeltaNetOp<bf16, bf16, true> cuda_bf16_bf16_gates;
    domain.Add(&cuda_f32);
    domain.Add(&cuda_f16);
    domain.Add(&cuda_f16_f16_gates);
    domain.Add(&cuda_bf16);
    domain.Add(&cuda_bf16_bf16_gates);
  }
#endif
}

}  // namespace ort_mtp
