// The GroupQueryAttention custom op: attribute, type and shape validation, and dispatch to the CPU kernel
// (group_query_attention.h). Inputs, outputs and attributes are com.microsoft::GroupQueryAttention's
// (ops/attention.py rewrites one into the other), for what the builder's graphs use: separate query, key
// and value with rotary already applied, a past/present KV cache in BNSH, seqlens_k and
// total_sequence_length. What this op does not compute (packed QKV, do_rotary, an attention bias, head
// sinks, position ids, a quantized cache) it does not declare, so a node asking for it is refused at
// load, never silently run without it.
//
// Every check runs on every call; seqlens_k's values are checked against the buffers before anything is
// read or written, so no model or input can make the kernel read or write out of bounds; each failure
// is an ORT error naming the node.
#include "attention/group_query_attention.h"

#include "attention/gqa_node.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/validate.h"
#include "ops.h"

namespace ort_mtp {
namespace {

constexpr const char* kOpName = "GroupQueryAttention";

enum Input { kQuery = 0, kKey, kValue, kPastKey, kPastValue, kSeqlensK, kTotalSeqLen, kInputCount = kGqaInputCount };
enum Output { kOut = 0, kPresentKey, kPresentValue, kOutputCount };
constexpr const char* kInputNames[kInputCount] = {"query",      "key",       "value",                "past_key",
                                                  "past_value", "seqlens_k", "total_sequence_length"};
constexpr const char* kOutputNames[kOutputCount] = {"output", "present_key", "present_value"};

// Bounds that keep every product of extents far from int64 overflow; far above any real model's.
constexpr int64_t kMaxHeads = 1 << 14;
constexpr int64_t kMaxLength = int64_t{1} << 31;

using InputDescs = std::array<TensorDesc, kInputCount>;

std::string InputLabel(int i) { return std::string("input ") + kInputNames[i]; }

struct Dims {
  int64_t B = 0, S = 0, H = 0, P = 0;
};

void CheckShape(const std::string& where, int i, const TensorDesc& d, const std::vector<int64_t>& expected,
                const char* form) {
  ort_mtp::CheckShape(where, InputLabel(i), d, expected, form);
}

Dims CheckInputs(const std::string& where, const GqaAttrs& at, FloatType type, const InputDescs& in) {
  for (int i = 0; i < kInputCount; ++i) {
    if (!in[i].present) Fail(where, InputLabel(i) + " is required");
    const ONNXTensorElementDataType want =
        i == kSeqlensK || i == kTotalSeqLen ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : OnnxType(type);
    if (in[i].type != want)
      Fail(where, InputLabel(i) + " is " + TypeName(in[i].type) + ", expected " + TypeName(want));
  }
  Dims d;
  const TensorDesc& q = in[kQuery];
  if (q.shape.size() != 3) Fail(where, "input query has shape " + ShapeToString(q.shape) + ", expected [B, S, num_heads * head_size]");
  d.B = q.shape[0];
  d.S = q.shape[1];
  if (q.shape[2] % at.num_heads != 0 || q.shape[2] == 0)
    Fail(where, "input query's last extent " + std::to_string(q.shape[2]) + " is not num_heads (" +
                    std::to_string(at.num_heads) + ") x a head size");
  d.H = q.shape[2] / at.num_heads;
  if (d.S < 1) Fail(where, "input query has shape " + ShapeToString(q.shape) + ": a call needs at least 1 token");
  CheckShape(where, kKey, in[kKey], {d.B, d.S, at.kv_num_heads * d.H}, "[B, S, kv_num_heads * head_size]");
  CheckShape(where, kValue, in[kValue], {d.B, d.S, at.kv_num_heads * d.H}, "[B, S, kv_num_heads * head_size]");
  CheckShape(where, kPastKey, in[kPastKey], {d.B, at.kv_num_heads, -1, d.H}, "[B, kv_num_heads, P, head_size]");
  d.P = in[kPastKey].shape[2];
  CheckShape(where, kPastValue, in[kPastValue], {d.B, at.kv_num_heads, d.P, d.H}, "past_key's shape");
  CheckShape(where, kSeqlensK, in[kSeqlensK], {d.B}, "[B]");
  if (ElementCount(in[kTotalSeqLen].shape) != 1)
    Fail(where, "input total_sequence_length must hold one value, got shape " + ShapeToString(in[kTotalSeqLen].shape));
  if (d.P > kMaxLength) Fail(where, "input past_key's length " + std::to_string(d.P) + " is too large");
  return d;
}

template <bool kCuda>
struct GroupQueryAttentionKernel {
  GroupQueryAttentionKernel(const OrtKernelInfo* raw_info, FloatType type) : type_(type) {
    Ort::ConstKernelInfo info{raw_info};
    where_ = NodeLabel(kOpName, info.GetNodeName());
    attrs_ = ReadGqaAttrs(info, where_);
    CheckNodeArity(info, where_, {std::begin(kInputNames), std::end(kInputNames)},
                   {std::begin(kOutputNames), std::end(kOutputNames)});
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) {
    return Guard(where_, [&] { Compute(raw_ctx); });
  }

  void Compute(OrtKernelContext* raw_ctx) {
    Ort::KernelContext ctx{raw_ctx};
    CheckCallArity(ctx, where_, kInputCount, kOutputCount);
    GqaInputs in;
    for (int i = 0; i < kInputCount; ++i) in.Set(i, ctx.GetInput(i));
    const GroupQueryAttentionProblem p = PrepareGqa(ctx, where_, attrs_, type_, in, kCuda);
    if (p.batch == 0) return;
    if constexpr (kCuda) {
#ifdef ORT_MTP_WITH_CUDA
      // seqlens_k is on the device: the kernel checks each row's positions there (group_query_attention.h).
      if (const char* error = GroupQueryAttentionCuda(p, ctx.GetGPUComputeStream())) Fail(where_, error, ORT_FAIL);
#endif
      return;
    }
    RunGqaCpu(ctx, p);
  }

  std::string where_;
  GqaAttrs attrs_;
  FloatType type_;
};

template <FloatType kType, bool kCuda>
struct GroupQueryAttentionOp
    : Ort::CustomOpBase<GroupQueryAttentionOp<kType, kCuda>, GroupQueryAttentionKernel<kCuda>, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return Guard(kOpName, [&] { *kernel = new GroupQueryAttentionKernel<kCuda>(info, kType); });
  }
  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return kCuda ? "CUDAExecutionProvider" : "CPUExecutionProvider"; }
  // total_sequence_length sizes present, so the host reads it (ORT's own kernel takes it on the CPU too);
  // everything else stays where the EP keeps it.
  OrtMemType GetInputMemoryType(size_t index) const {
    return index == kTotalSeqLen ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  }

  size_t GetInputTypeCount() const { return kInputCount; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == kSeqlensK || index == kTotalSeqLen ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : OnnxType(kType);
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }
  size_t GetOutputTypeCount() const { return kOutputCount; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return OnnxType(kType); }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }
};

}  // namespace

GqaAttrs ReadGqaAttrs(const Ort::ConstKernelInfo& info, const std::string& where) {
  GqaAttrs a;
  a.num_heads = IntAttr(info, where, "num_heads", 1, kMaxHeads);
  a.kv_num_heads = IntAttr(info, where, "kv_num_heads", 1, kMaxHeads);
  if (a.num_heads % a.kv_num_heads != 0)
    Fail(where, "num_heads (" + std::to_string(a.num_heads) + ") must be a multiple of kv_num_heads (" +
                    std::to_string(a.kv_num_heads) + ")");
  a.scale = FloatAttr(info, where, "scale", 0.f, -INFINITY);  // 0: 1 / sqrt(head_size), as ORT
  a.softcap = FloatAttr(info, where, "softcap", 0.f, 0.f);
  a.local_window = IntAttr(info, where, "local_window_size", -1, kMaxLength, -1);
  if (a.local_window == 0) Fail(where, "attribute local_window_size must be -1 (no window) or > 0, got 0");
  a.smooth_softmax = IntAttr(info, where, "smooth_softmax", 0, 1, 0) == 1;
  // Rotary inside the op is not computed here: the builder applies MRoPE before the node.
  if (IntAttr(info, where, "do_rotary", 0, 1, 0) != 0)
    Fail(where, "do_rotary=1 is not supported (apply rotary embeddings before the node)", ORT_NOT_IMPLEMENTED);
  IntAttr(info, where, "rotary_interleaved", 0, 1, 0);  // meaningful only with do_rotary
  return a;
}

void GqaInputs::Set(int i, const Ort::ConstValue& v) {
  desc[i] = Describe(v);
  data[i] = desc[i].present ? v.GetTensorRawData() : nullptr;
}

GroupQueryAttentionProblem PrepareGqa(Ort::KernelContext& ctx, const std::string& where, const GqaAttrs& at,
                                      FloatType type, const GqaInputs& in, bool cuda) {
  const Dims d = CheckInputs(where, at, type, in.desc);
  const int64_t total = static_cast<const int32_t*>(in.data[kTotalSeqLen])[0];  // a CPU input on both EPs
  if (total < 1) Fail(where, "total_sequence_length must be >= 1, got " + std::to_string(total));
  const int64_t present_len = std::max(total, d.P);  // ORT's present length

  const std::vector<int64_t> out_shape = {d.B, d.S, at.num_heads * d.H};
  const std::vector<int64_t> kv_shape = {d.B, at.kv_num_heads, present_len, d.H};
  Ort::UnownedValue out = ctx.GetOutput(kOut, out_shape);
  Ort::UnownedValue present_k = ctx.GetOutput(kPresentKey, kv_shape);
  Ort::UnownedValue present_v = ctx.GetOutput(kPresentValue, kv_shape);
  const std::vector<int64_t>* shapes[kOutputCount] = {&out_shape, &kv_shape, &kv_shape};
  const Ort::UnownedValue* outs[kOutputCount] = {&out, &present_k, &present_v};
  for (int i = 0; i < kOutputCount; ++i)
    CheckOutput(where, std::string("output ") + kOutputNames[i], *outs[i], OnnxType(type), *shapes[i]);

  GroupQueryAttentionProblem p;
  p.batch = d.B;
  p.seq = d.S;
  p.num_heads = at.num_heads;
  p.kv_num_heads = at.kv_num_heads;
  p.head_size = d.H;
  p.past_len = d.P;
  p.present_len = present_len;
  p.scale = at.scale != 0.f ? at.scale : 1.f / std::sqrt(static_cast<float>(d.H));
  p.softcap = at.softcap;
  p.local_window = at.local_window;
  p.smooth_softmax = at.smooth_softmax;
  p.type = type;
  p.query = in.data[kQuery];
  p.key = in.data[kKey];
  p.value = in.data[kValue];
  p.past_key = in.data[kPastKey];
  p.past_value = in.data[kPastValue];
  p.seqlens_k = static_cast<const int32_t*>(in.data[kSeqlensK]);
  if (d.B == 0) {
    p.batch = 0;
    return p;
  }
  p.output = out.GetTensorMutableRawData();
  p.present_key = present_k.GetTensorMutableRawData();
  p.present_value = present_v.GetTensorMutableRawData();
  const bool key_shared = p.present_key == p.past_key, value_shared = p.present_value == p.past_value;
  if (key_shared != value_shared)
    Fail(where, "present_key shares past_key's buffer but present_value does not share past_value's (or the "
                "other way round): bind both or neither");
  p.share_buffer = key_shared;
  if (p.share_buffer && present_len != d.P)
    Fail(where, "present_key shares past_key's buffer, but total_sequence_length " + std::to_string(total) +
                    " exceeds its length " + std::to_string(d.P));
  if (cuda) return p;  // seqlens_k is on the device: the CUDA kernel checks the positions there
  // Where each batch row's new tokens go: positions past .. past + S - 1 of the cache, past =
  // seqlens_k + 1 - S. Checked here, before anything is written.
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t seqlen = p.seqlens_k[b];
    const int64_t past = seqlen + 1 - d.S;
    if (seqlen < 0 || past < 0)
      Fail(where, "seqlens_k[" + std::to_string(b) + "] = " + std::to_string(seqlen) + " but the call has " +
                      std::to_string(d.S) + " tokens: seqlens_k + 1 (the total length) must be at least S "
                      "(padded batch rows are not supported)");
    if (past + d.S > present_len)
      Fail(where, "seqlens_k[" + std::to_string(b) + "] = " + std::to_string(seqlen) +
                      " puts the call's tokens past the end of the KV cache (length " + std::to_string(present_len) +
                      ")");
    if (!p.share_buffer && past > d.P)
      Fail(where, "seqlens_k[" + std::to_string(b) + "] = " + std::to_string(seqlen) + " asks for " +
                      std::to_string(past) + " past positions but past_key holds " + std::to_string(d.P));
  }
  return p;
}

void RunGqaCpu(Ort::KernelContext& ctx, const GroupQueryAttentionProblem& p) {
  GroupQueryAttentionCpu(p, KernelParallelFor, &ctx);
}

// The CPU classes always; the CUDA classes in a CUDA build unless ORT_MTP_GQA_CUDA=0 (then CUDA models keep
// ORT's node: the rewrite asks the library which kernels it has, ops/attention.py). The CUDA kernel passes
// its GPU group (tests/gpu, group-query-attention: widths 1..16 bit-identical to width-1 calls), and with it
// the 27B-class folder's MTP stream equals greedy's where ORT's node does not (bench/results/
// 2026-12-03-float-matmul); the speeds against ORT's node are in bench/group_query_attention.py's results.
void AddGroupQueryAttentionOps(Ort::CustomOpDomain& domain, bool with_cuda) {
  AddFloatTypedOps<GroupQueryAttentionOp>(domain, with_cuda && CudaKernelSwitch("ORT_MTP_GQA_CUDA", true));
}

}  // namespace ort_mtp
