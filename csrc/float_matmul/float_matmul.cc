// The MatMul custom op: type and shape validation, and dispatch to the CPU or CUDA kernel
// (float_matmul.h). Inputs A [..., K] and B [K, N], output Y [..., N], all of one float type: ONNX
// MatMul's semantics for a 2-D B (ops/float_matmul.py rewrites one into the other where B is a constant
// weight). A batched B, or A and B of different types, is refused with an error naming the node.
//
// Every check runs on every call, so no model or input can make a kernel read or write out of bounds;
// each failure is an ORT error naming the node.
#include "float_matmul/float_matmul.h"

#include <array>
#include <string>
#include <vector>

#include "common/validate.h"
#include "ops.h"

namespace ort_mtp {
namespace {

constexpr const char* kOpName = "MatMul";

// Extents are bounded so that no product of them, nor an index in a kernel (int64 rows, int32 K and N
// as the CUDA kernel takes them), can overflow.
constexpr int64_t kMaxExtent = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxElements = int64_t{1} << 40;

template <bool kCuda>
struct FloatMatMulKernel {
  FloatMatMulKernel(const OrtKernelInfo* raw_info, FloatType type) : type_(type) {
    Ort::ConstKernelInfo info{raw_info};
    where_ = NodeLabel(kOpName, info.GetNodeName());
    if (info.GetInputCount() != 2) Fail(where_, "takes 2 inputs (A, B), got " + std::to_string(info.GetInputCount()));
    if (info.GetOutputCount() != 1) Fail(where_, "has 1 output (Y), got " + std::to_string(info.GetOutputCount()));
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) {
    return Guard(where_, [&] { Compute(raw_ctx); });
  }

  void Compute(OrtKernelContext* raw_ctx) {
    Ort::KernelContext ctx{raw_ctx};
    if (ctx.GetInputCount() != 2 || ctx.GetOutputCount() != 1) Fail(where_, "expects 2 inputs and 1 output");
    const Ort::ConstValue a = ctx.GetInput(0), b = ctx.GetInput(1);
    const TensorDesc da = Describe(a), db = Describe(b);
    if (!da.present || !db.present) Fail(where_, "inputs A and B are required");
    const ONNXTensorElementDataType want = OnnxType(type_);
    if (da.type != want) Fail(where_, std::string("input A is ") + TypeName(da.type) + ", expected " + TypeName(want));
    if (db.type != want) Fail(where_, std::string("input B is ") + TypeName(db.type) + ", expected " + TypeName(want));
    if (da.shape.empty()) Fail(where_, "input A is a scalar; it needs at least one dimension [..., K]");
    if (db.shape.size() != 2)
      Fail(where_, "input B has shape " + ShapeToString(db.shape) + ", expected a matrix [K, N] (a batched B is not supported)");
    const int64_t k = da.shape.back();
    CheckShape(where_, "input B", db, {k, -1}, "[K, N] with K A's last extent");
    const int64_t n = db.shape[1];
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < da.shape.size(); ++i) rows *= da.shape[i];
    if (k > kMaxExtent || n > kMaxExtent || rows > kMaxElements || rows * n > kMaxElements)
      Fail(where_, "A " + ShapeToString(da.shape) + " and B " + ShapeToString(db.shape) + " are too large");

    std::vector<int64_t> y_shape(da.shape.begin(), da.shape.end() - 1);
    y_shape.push_back(n);
    Ort::UnownedValue y = ctx.GetOutput(0, y_shape);
    CheckOutput(where_, "output Y", y, want, y_shape);
    if (rows == 0 || n == 0) return;

    FloatMatMulProblem p;
    p.m = rows;
    p.k = k;
    p.n = n;
    p.type = type_;
    p.a = a.GetTensorRawData();
    p.b = b.GetTensorRawData();
    p.y = y.GetTensorMutableRawData();
    if constexpr (kCuda) {
#ifdef ORT_MTP_WITH_CUDA
      if (const char* error = FloatMatMulCuda(p, ctx.GetGPUComputeStream())) Fail(where_, error, ORT_FAIL);
#endif
      return;
    }
    FloatMatMulCpu(
        p,
        [](void* c, void (*fn)(void*, size_t), size_t tasks, void* user) {
          static_cast<Ort::KernelContext*>(c)->ParallelFor(fn, tasks, 0, user);
        },
        &ctx);
  }

  std::string where_;
  FloatType type_;
};

template <FloatType kType, bool kCuda>
struct FloatMatMulOp : Ort::CustomOpBase<FloatMatMulOp<kType, kCuda>, FloatMatMulKernel<kCuda>, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return Guard(kOpName, [&] { *kernel = new FloatMatMulKernel<kCuda>(info, kType); });
  }
  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return kCuda ? "CUDAExecutionProvider" : "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t) const { return OnnxType(kType); }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return OnnxType(kType); }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }
};

}  // namespace

void AddFloatMatMulOps(Ort::CustomOpDomain& domain, bool with_cuda) {
  static FloatMatMulOp<FloatType::kFloat32, false> cpu_f32;
  static FloatMatMulOp<FloatType::kFloat16, false> cpu_f16;
  static FloatMatMulOp<FloatType::kBFloat16, false> cpu_bf16;
  domain.Add(&cpu_f32);
  domain.Add(&cpu_f16);
  domain.Add(&cpu_bf16);
#ifdef ORT_MTP_WITH_CUDA
  if (with_cuda) {
    static FloatMatMulOp<FloatType::kFloat32, true> cuda_f32;
    static FloatMatMulOp<FloatType::kFloat16, true> cuda_f16;
    static FloatMatMulOp<FloatType::kBFloat16, true> cuda_bf16;
    domain.Add(&cuda_f32);
    domain.Add(&cuda_f16);
    domain.Add(&cuda_bf16);
  }
#else
  (void)with_cuda;
#endif
}

}  // namespace ort_mtp
