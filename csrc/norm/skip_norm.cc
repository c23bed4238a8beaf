// The SkipSimplifiedLayerNormalization custom op: validation and dispatch to the CPU or CUDA kernel
// (skip_norm.h). com.microsoft's inputs and outputs in their positions, so a node is rewritten by its
// domain alone (ops/norm.py): input [..., H], skip (input's shape), gamma [H], bias [H] (optional) ->
// output, mean and inv_std_var (not computed: the node must leave them out), input_skip_bias_sum
// (optional). Attribute epsilon (required, finite, >= 0). Every check runs on every call, so no model or
// input makes a kernel read or write out of bounds; each failure is an ORT error naming the node.
#include "norm/skip_norm.h"

#include <string>
#include <vector>

#include "common/validate.h"
#include "ops.h"

namespace ort_mtp {
namespace {

constexpr const char* kOpName = "SkipSimplifiedLayerNormalization";
constexpr int64_t kMaxElements = int64_t{1} << 40;
enum Output { kY = 0, kMean = 1, kInvStdVar = 2, kSum = 3 };

template <bool kCuda>
struct SkipNormKernel {
  SkipNormKernel(const OrtKernelInfo* raw_info, FloatType type) : type_(type) {
    Ort::ConstKernelInfo info{raw_info};
    where_ = NodeLabel(kOpName, info.GetNodeName());
    const size_t inputs = info.GetInputCount(), outputs = info.GetOutputCount();
    if (inputs < 3 || inputs > 4)
      Fail(where_, "takes 3 inputs (input, skip, gamma) or 4 (and bias), got " + std::to_string(inputs));
    if (outputs < 1 || outputs > 4) Fail(where_, "has " + std::to_string(outputs) + " outputs, expected 1 to 4");
    for (int i : {kMean, kInvStdVar})
      if (static_cast<size_t>(i) < outputs && !info.GetOutputName(i).empty())
        Fail(where_, "outputs mean and inv_std_var are not computed: leave them out (empty names)",
             ORT_NOT_IMPLEMENTED);
    if (!HasAttribute(info, "epsilon")) Fail(where_, "attribute epsilon is required");
    epsilon_ = FloatAttr(info, where_, "epsilon", 0.f, 0.f);
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) {
    return Guard(where_, [&] { Compute(raw_ctx); });
  }

  void Compute(OrtKernelContext* raw_ctx) {
    Ort::KernelContext ctx{raw_ctx};
    const size_t inputs = ctx.GetInputCount(), outputs = ctx.GetOutputCount();
    const ONNXTensorElementDataType want = OnnxType(type_);
    auto input = [&](size_t i, const char* name) {
      const Ort::ConstValue v = i < inputs ? ctx.GetInput(i) : Ort::ConstValue{nullptr};
      TensorDesc d = Describe(v);
      if (d.present && d.type != want)
        Fail(where_, std::string("input ") + name + " is " + TypeName(d.type) + ", expected " + TypeName(want));
      return std::make_pair(v, d);
    };
    const auto [x, dx] = input(0, "input");
    const auto [skip, ds] = input(1, "skip");
    const auto [gamma, dg] = input(2, "gamma");
    const auto [bias, db] = input(3, "bias");
    if (!dx.present || !ds.present || !dg.present) Fail(where_, "inputs input, skip and gamma are required");
    if (dx.shape.empty()) Fail(where_, "input is a scalar; it needs at least one dimension [..., H]");
    const int64_t H = dx.shape.back();
    const int64_t elements = ElementCount(dx.shape);
    if (elements > kMaxElements) Fail(where_, "input " + ShapeToString(dx.shape) + " is too large");
    if (ds.shape != dx.shape)
      Fail(where_, "input skip has shape " + ShapeToString(ds.shape) + ", expected input's " + ShapeToString(dx.shape));
    CheckShape(where_, "input gamma", dg, {H}, "[H] with H input's last extent");
    if (db.present) CheckShape(where_, "input bias", db, {H}, "[H] with H input's last extent");

    SkipNormProblem p;
    p.hidden = H;
    p.rows = H ? elements / H : 0;
    p.epsilon = epsilon_;
    p.type = type_;
    p.input = x.GetTensorRawData();
    p.skip = skip.GetTensorRawData();
    p.gamma = gamma.GetTensorRawData();
    p.bias = db.present ? bias.GetTensorRawData() : nullptr;
    Ort::UnownedValue y = ctx.GetOutput(kY, dx.shape);
    CheckOutput(where_, "output", y, want, dx.shape);
    p.y = y.GetTensorMutableRawData();
    if (outputs > kSum) {
      Ort::UnownedValue sum = ctx.GetOutput(kSum, dx.shape);
      if (sum) {
        CheckOutput(where_, "output input_skip_bias_sum", sum, want, dx.shape);
        p.sum = sum.GetTensorMutableRawData();
      }
    }
    if (p.rows == 0 || H == 0) return;
    if constexpr (kCuda) {
#ifdef ORT_MTP_WITH_CUDA
      if (const char* error = SkipNormCuda(p, ctx.GetGPUComputeStream())) Fail(where_, error, ORT_FAIL);
#endif
      return;
    }
    SkipNormCpu(p, KernelParallelFor, &ctx);
  }

  std::string where_;
  FloatType type_;
  float epsilon_ = 0.f;
};

template <FloatType kType, bool kCuda>
struct SkipNormOp : Ort::CustomOpBase<SkipNormOp<kType, kCuda>, SkipNormKernel<kCuda>, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return Guard(kOpName, [&] { *kernel = new SkipNormKernel<kCuda>(info, kType); });
  }
  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return kCuda ? "CUDAExecutionProvider" : "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 4; }  // input, skip, gamma, bias (optional)
  ONNXTensorElementDataType GetInputType(size_t) const { return OnnxType(kType); }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i < 3 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 4; }  // output, mean, inv_std_var, input_skip_bias_sum
  ONNXTensorElementDataType GetOutputType(size_t i) const {
    return i == kMean || i == kInvStdVar ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : OnnxType(kType);
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i == kY ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
};

}  // namespace

// The CPU classes always; the CUDA classes in a CUDA build only with ORT_MTP_SKIP_NORM_CUDA=1: measured
// end to end, the CUDA kernel made the 27B-class model slower than ORT's node
// (bench/results/2026-12-05-skip-norm-cuda). Without it CUDA models keep ORT's node (the rewrite asks the
// library which kernels it has, ops/norm.py).
void AddSkipNormOps(Ort::CustomOpDomain& domain, bool with_cuda) {
  AddFloatTypedOps<SkipNormOp>(domain, with_cuda && CudaKernelSwitch("ORT_MTP_SKIP_NORM_CUDA", false));
}

}  // namespace ort_mtp
