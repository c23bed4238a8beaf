// The MatMul custom op: type and shape validation, and dispatch to the CPU or CUDA kernel
// (float_matmul.h). Inputs A [..., K] and B [K, N], output Y [..., N], all of one float type: ONNX
// MatMul's semantics for a 2-D B (ops/float_matmul.py rewrites one into the other where B is a constant
// weight). A batched B, or A and B of different types, is refused with an error naming the node. An
// optional third input B2 [K, N2] with a second output Y2 [..., N2] makes the node two MatMuls of one A
// (float_matmul.h): each output is what a one-weight node computes.
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
    const size_t inputs = info.GetInputCount(), outputs = info.GetOutputCount();
    if (inputs != 2 && inputs != 3)
      Fail(where_, "takes 2 inputs (A, B) or 3 (A, B, B2), got " + std::to_string(inputs));
    if (outputs != inputs - 1)
      Fail(where_, std::to_string(inputs) + " inputs need " + std::to_string(inputs - 1) + " output" +
                       (inputs == 3 ? "s (Y, Y2)" : " (Y)") + ", got " + std::to_string(outputs));
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) {
    return Guard(where_, [&] { Compute(raw_ctx); });
  }

  void Compute(OrtKernelContext* raw_ctx) {
    Ort::KernelContext ctx{raw_ctx};
    const size_t inputs = ctx.GetInputCount();
    if ((inputs != 2 && inputs != 3) || ctx.GetOutputCount() != inputs - 1)
      Fail(where_, "expects 2 inputs and 1 output, or 3 inputs and 2 outputs");
    const Ort::ConstValue a = ctx.GetInput(0);
    const TensorDesc da = Describe(a);
    if (!da.present) Fail(where_, "input A is required");
    const ONNXTensorElementDataType want = OnnxType(type_);
    if (da.type != want) Fail(where_, std::string("input A is ") + TypeName(da.type) + ", expected " + TypeName(want));
    if (da.shape.empty()) Fail(where_, "input A is a scalar; it needs at least one dimension [..., K]");
    const int64_t k = da.shape.back();
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < da.shape.size(); ++i) rows *= da.shape[i];
    if (k > kMaxExtent || rows > kMaxElements) Fail(where_, "A " + ShapeToString(da.shape) + " is too large");

    FloatMatMulProblem p;
    p.m = rows;
    p.k = k;
    p.type = type_;
    p.a = a.GetTensorRawData();
    // Weight i (B or B2) and its output: validated, allocated; returns N.
    const auto weight = [&](size_t i, const void*& b_data, void*& y_data) -> int64_t {
      const char* b_name = i == 1 ? "input B" : "input B2";
      const char* y_name = i == 1 ? "output Y" : "output Y2";
      const Ort::ConstValue b = ctx.GetInput(i);
      const TensorDesc db = Describe(b);
      if (!db.present) Fail(where_, std::string(b_name) + " is required");
      if (db.type != want) Fail(where_, std::string(b_name) + " is " + TypeName(db.type) + ", expected " + TypeName(want));
      if (db.shape.size() != 2)
        Fail(where_, std::string(b_name) + " has shape " + ShapeToString(db.shape) +
                         ", expected a matrix [K, N] (a batched B is not supported)");
      CheckShape(where_, b_name, db, {k, -1}, "[K, N] with K A's last extent");
      const int64_t n = db.shape[1];
      if (n > kMaxExtent || rows * n > kMaxElements)
        Fail(where_, "A " + ShapeToString(da.shape) + " and " + b_name + " " + ShapeToString(db.shape) + " are too large");
      std::vector<int64_t> y_shape(da.shape.begin(), da.shape.end() - 1);
      y_shape.push_back(n);
      Ort::UnownedValue y = ctx.GetOutput(i - 1, y_shape);
      CheckOutput(where_, y_name, y, want, y_shape);
      b_data = b.GetTensorRawData();
      y_data = y.GetTensorMutableRawData();
      return n;
    };
    p.n = weight(1, p.b, p.y);
    if (inputs == 3) p.n2 = weight(2, p.b2, p.y2);
    if (p.n == 0) {  // nothing to compute for B: the second weight, if any, alone
      p.n = p.n2, p.b = p.b2, p.y = p.y2;
      p.n2 = 0;
    }
    if (p.n2 == 0) p.b2 = nullptr, p.y2 = nullptr;
    if (rows == 0 || p.n == 0) return;
    if constexpr (kCuda) {
#ifdef ORT_MTP_WITH_CUDA
      if (const char* error = FloatMatMulCuda(p, ctx.GetGPUComputeStream())) Fail(where_, error, ORT_FAIL);
#endif
      return;
    }
    FloatMatMulCpu(p, KernelParallelFor, &ctx);
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
  size_t GetInputTypeCount() const { return 3; }  // A, B, B2 (optional)
  ONNXTensorElementDataType GetInputType(size_t) const { return OnnxType(kType); }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i < 2 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 2; }  // Y, Y2 (optional)
  ONNXTensorElementDataType GetOutputType(size_t) const { return OnnxType(kType); }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i < 1 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
};

}  // namespace

void AddFloatMatMulOps(Ort::CustomOpDomain& domain, bool with_cuda) {
  AddFloatTypedOps<FloatMatMulOp>(domain, with_cuda);
}

}  // namespace ort_mtp
