// The MatMulNBits custom op: attribute and shape validation, and dispatch to the CPU or CUDA kernel.
// One op class per (activation type, execution provider); ONNX Runtime merges them into one schema
// with the union of their type constraints.
#include "matmul_nbits/matmul_nbits.h"

#include <cstdio>
#include <string>
#include <vector>

#include "common/validate.h"
#include "ops.h"

namespace ort_mtp {
namespace {

// Memory the system can still hand out without swapping (Linux's MemAvailable), or -1 where unknown.
int64_t AvailableMemoryBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long kib = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
    kib = -1;
  }
  std::fclose(f);
  return kib < 0 ? -1 : static_cast<int64_t>(kib) * 1024;
}

constexpr const char* kOpName = "MatMulNBits";
enum Input { kA = 0, kB = 1, kScales = 2, kZeroPoints = 3, kGIdx = 4, kBias = 5, kInputCount = 6 };

ONNXTensorElementDataType OnnxType(ElemType t) {
  switch (t) {
    case ElemType::kFloat32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case ElemType::kFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case ElemType::kBFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
  }
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

struct Attrs {
  int64_t K = 0, N = 0, bits = 0, block_size = 0, accuracy_level = 0;
  int64_t packing = 0;  // WeightLayout: 0 row-major (com.microsoft's), 1 tiles (ops.packing wrote B and scales)
};

// True when the node has attribute `name` with a type other than int (float, string or a list). A
// custom-op schema declares no attribute types, so ORT does not check them: without this, bits=8.0
// would read as "absent" and silently fall back to 4.
bool HasNonIntAttribute(const Ort::ConstKernelInfo& info, const char* name) {
  const OrtApi& api = Ort::GetApi();
  auto ok = [](OrtStatus* raw) { return Ort::Status{raw}.IsOK(); };
  float f = 0.f;
  size_t size = 0;
  return ok(api.KernelInfoGetAttribute_float(info, name, &f)) ||
         ok(api.KernelInfoGetAttribute_string(info, name, nullptr, &size)) ||
         ok(api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size)) ||
         ok(api.KernelInfoGetAttributeArray_float(info, name, nullptr, &size));
}

int64_t RequiredInt(const Ort::ConstKernelInfo& info, const std::string& where, const char* name) {
  int64_t value = 0;
  Ort::Status status{Ort::GetApi().KernelInfoGetAttribute_int64(info, name, &value)};
  if (!status.IsOK()) {
    if (HasNonIntAttribute(info, name)) Fail(where, std::string("attribute '") + name + "' must be an int");
    Fail(where, std::string("missing required int attribute '") + name + "'");
  }
  return value;
}

int64_t OptionalInt(const Ort::ConstKernelInfo& info, const std::string& where, const char* name, int64_t fallback) {
  int64_t value = 0;
  Ort::Status status{Ort::GetApi().KernelInfoGetAttribute_int64(info, name, &value)};
  if (status.IsOK()) return value;
  if (HasNonIntAttribute(info, name)) Fail(where, std::string("attribute '") + name + "' must be an int");
  return fallback;
}

Attrs ReadAttrs(const Ort::ConstKernelInfo& info, const std::string& where) {
  Attrs a;
  a.K = RequiredInt(info, where, "K");
  a.N = RequiredInt(info, where, "N");
  a.bits = OptionalInt(info, where, "bits", 4);
  a.block_size = RequiredInt(info, where, "block_size");
  a.accuracy_level = OptionalInt(info, where, "accuracy_level", 0);
  // The bound keeps every size derived from K and N (N * k_blocks * block_bytes, the kernels' int
  // indices) free of overflow, so a shape check cannot pass by wrapping around.
  constexpr int64_t kMaxDim = INT32_MAX;
  if (a.K <= 0 || a.K > kMaxDim)
    Fail(where, "attribute K must be in [1, " + std::to_string(kMaxDim) + "], got " + std::to_string(a.K));
  if (a.N <= 0 || a.N > kMaxDim)
    Fail(where, "attribute N must be in [1, " + std::to_string(kMaxDim) + "], got " + std::to_string(a.N));
  if (a.bits != 4 && a.bits != 8)
    Fail(where, "attribute bits=" + std::to_string(a.bits) + " is not supported (4 or 8)", ORT_NOT_IMPLEMENTED);
  const int64_t bs = a.block_size;
  if (bs < 16 || bs > 256 || (bs & (bs - 1)) != 0)
    Fail(where, "attribute block_size must be a power of two in [16, 256], got " + std::to_string(bs));
  if (a.accuracy_level < 0 || a.accuracy_level > 4)
    Fail(where, "attribute accuracy_level must be in [0, 4], got " + std::to_string(a.accuracy_level));
  a.packing = OptionalInt(info, where, "packing", 0);
  if (a.packing != 0 && a.packing != 1)
    Fail(where, "attribute packing must be 0 (row-major) or 1 (tiles), got " + std::to_string(a.packing));
  if (a.packing == 1) {
    const std::string tiles = "packing=1 (tiles) needs ";
    if (a.bits != 4) Fail(where, tiles + "bits=4, got bits=" + std::to_string(a.bits));
    if (bs != 32 && bs != 64 && bs != 128)
      Fail(where, tiles + "block_size 32, 64 or 128, got " + std::to_string(bs));
    if (a.K % kTileK != 0) Fail(where, tiles + "K a multiple of 256, got K=" + std::to_string(a.K));
    if (a.N % kTileRows != 0) Fail(where, tiles + "N a multiple of 16, got N=" + std::to_string(a.N));
  }
  return a;
}

// Shapes and types of the constant-shaped inputs (B, scales, zero_points, bias). Checked once at
// session creation where they are initializers, and again on every call.
struct WeightInfo {
  TensorDesc b, scales, zp, bias;
};

// Accepts `shape` when it is [rows * cols] or [rows, cols].
bool IsMatrix(const std::vector<int64_t>& shape, int64_t rows, int64_t cols) {
  if (shape.size() == 1) return shape[0] == rows * cols;
  return shape.size() == 2 && shape[0] == rows && shape[1] == cols;
}

// Fills the layout fields of `p` from the attributes and validates what is known in `w`.
void CheckWeights(const std::string& where, const Attrs& at, ElemType type, const WeightInfo& w,
                  MatMulNBitsProblem& p) {
  p.N = at.N;
  p.K = at.K;
  p.bits = static_cast<int>(at.bits);
  p.block_size = static_cast<int>(at.block_size);
  p.k_blocks = (at.K + at.block_size - 1) / at.block_size;
  p.block_bytes = at.block_size * at.bits / 8;
  p.zp_row_bytes = (p.k_blocks * at.bits + 7) / 8;
  p.type = type;
  p.layout = at.packing == 1 ? WeightLayout::kTiles : WeightLayout::kRowMajor;
  if (at.packing == 1 && type == ElemType::kFloat32)
    Fail(where, "packing=1 (tiles) needs float16 or bfloat16 activations, got float");
  const std::string t = TypeName(OnnxType(type));
  const std::string kn = " for K=" + std::to_string(at.K) + ", N=" + std::to_string(at.N) +
                         ", block_size=" + std::to_string(at.block_size) + ", bits=" + std::to_string(at.bits);
  if (w.b.present) {
    if (w.b.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      Fail(where, std::string("input B must be uint8, got ") + TypeName(w.b.type));
    const bool rank3 = w.b.shape.size() == 3 && w.b.shape[0] == at.N && w.b.shape[1] == p.k_blocks &&
                       w.b.shape[2] == p.block_bytes;
    if (!rank3 && !IsMatrix(w.b.shape, at.N, p.k_blocks * p.block_bytes))
      Fail(where, "input B has shape " + ShapeToString(w.b.shape) + ", expected " +
                      ShapeToString({at.N, p.k_blocks, p.block_bytes}) + kn);
  }
  if (w.scales.present) {
    if (w.scales.type != OnnxType(type))
      Fail(where, std::string("input scales must have A's type ") + t + ", got " + TypeName(w.scales.type));
    if (!IsMatrix(w.scales.shape, at.N, p.k_blocks))
      Fail(where, "input scales has shape " + ShapeToString(w.scales.shape) + ", expected " +
                      ShapeToString({at.N, p.k_blocks}) + " or " + ShapeToString({at.N * p.k_blocks}) + kn);
  }
  p.zp_kind = ZeroPointKind::kNone;
  if (w.zp.present) {
    if (w.zp.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8) {
      p.zp_kind = ZeroPointKind::kPacked;
      if (!IsMatrix(w.zp.shape, at.N, p.zp_row_bytes))
        Fail(where, "input zero_points (uint8, packed) has shape " + ShapeToString(w.zp.shape) + ", expected " +
                        ShapeToString({at.N, p.zp_row_bytes}) + " or " + ShapeToString({at.N * p.zp_row_bytes}) + kn);
    } else if (w.zp.type == OnnxType(type)) {
      p.zp_kind = ZeroPointKind::kTyped;
      if (!IsMatrix(w.zp.shape, at.N, p.k_blocks))
        Fail(where, "input zero_points (" + t + ") has shape " + ShapeToString(w.zp.shape) + ", expected " +
                        ShapeToString({at.N, p.k_blocks}) + " or " + ShapeToString({at.N * p.k_blocks}) + kn);
    } else {
      Fail(where, std::string("input zero_points must be uint8 or A's type ") + t + ", got " + TypeName(w.zp.type));
    }
  }
  if (w.bias.present) {
    if (w.bias.type != OnnxType(type))
      Fail(where, std::string("input bias must have A's type ") + t + ", got " + TypeName(w.bias.type));
    if (w.bias.shape.size() != 1 || w.bias.shape[0] != at.N)
      Fail(where, "input bias has shape " + ShapeToString(w.bias.shape) + ", expected " + ShapeToString({at.N}));
  }
}

struct MatMulNBitsKernel {
  MatMulNBitsKernel(const OrtKernelInfo* raw_info, ElemType type, bool cuda) : type_(type), cuda_(cuda) {
    Ort::ConstKernelInfo info{raw_info};
    where_ = NodeLabel(kOpName, info.GetNodeName());
    attrs_ = ReadAttrs(info, where_);
    const size_t n_inputs = info.GetInputCount();
    if (n_inputs > kGIdx && !info.GetInputName(kGIdx).empty())
      Fail(where_, "input g_idx (act-order / grouped index) is not supported; export without act-order",
           ORT_NOT_IMPLEMENTED);
    // Any zero_points input, constant or not, so Compute never meets one with packing=1.
    if (attrs_.packing == 1 && n_inputs > kZeroPoints && !info.GetInputName(kZeroPoints).empty())
      Fail(where_, "packing=1 (tiles) does not take zero_points (symmetric weights only)");
    // Validate initializer shapes now, so a bad model fails at session creation.
    auto constant = [&](int index) -> TensorDesc {
      if (static_cast<size_t>(index) >= n_inputs || info.GetInputName(index).empty()) return {};
      int is_constant = 0;
      Ort::ConstValue v = info.GetTensorConstantInput(index, &is_constant);
      return is_constant ? Describe(v) : TensorDesc{};
    };
    const WeightInfo w{constant(kB), constant(kScales), constant(kZeroPoints), constant(kBias)};
    MatMulNBitsProblem weights;
    CheckWeights(where_, attrs_, type_, w, weights);
    // The CUDA kernel may prefetch constant weights before the previous kernel has finished.
    const bool has_zp_input = n_inputs > kZeroPoints && !info.GetInputName(kZeroPoints).empty();
    weights_constant_ = w.b.present && w.scales.present && (!has_zp_input || w.zp.present);
    if (!cuda_ && weights_constant_) PackForCpu(info, weights, has_zp_input);
  }

  // The CPU int8 kernel's own copy of constant weights in the kCpuGroups layout (matmul_nbits.h): the
  // order its vector loads read them in. It costs one more copy of B, scales and zero points in memory
  // for the session's life (ORT keeps the initializers); ORT_MTP_CPU_PACK=0 turns it off and the kernel
  // then gathers each unit from the row-major weights as it goes (the same bits, slower).
  void PackForCpu(Ort::ConstKernelInfo& info, MatMulNBitsProblem& p, bool has_zp) {
    p.accuracy_level = static_cast<int>(attrs_.accuracy_level);
    if (!MatMulNBitsCpuPackable(p)) return;
    // Each node's copy is made as its kernel is created, so a model too big to hold twice in memory
    // stops copying (and keeps reading the row-major weights, the same bits) where memory runs short,
    // rather than being killed for running out of it.
    const size_t need = MatMulNBitsCpuPackBytes(p);
    const int64_t available = AvailableMemoryBytes();
    if (available >= 0 && need > static_cast<size_t>(available) / 2) {
      const std::string message = where_ + ": no grouped copy of the weights for the CPU int8 kernel (" +
                                  std::to_string(need >> 10) + " KiB, with " + std::to_string(available >> 20) +
                                  " MiB of memory available): it reads the row-major weights, slower";
      ORT_CXX_LOG_NOEXCEPT(info.GetLogger(), ORT_LOGGING_LEVEL_WARNING, message.c_str());
      return;
    }
    int is_constant = 0;
    p.b = static_cast<const uint8_t*>(info.GetTensorConstantInput(kB, &is_constant).GetTensorRawData());
    p.scales = info.GetTensorConstantInput(kScales, &is_constant).GetTensorRawData();
    if (has_zp) p.zero_points = info.GetTensorConstantInput(kZeroPoints, &is_constant).GetTensorRawData();
    MatMulNBitsCpuPack(p, grouped_);
    const size_t bytes = grouped_.b.size() + grouped_.scales.size() + grouped_.zero_points.size();
    const std::string message = where_ + ": the CPU int8 kernel reads its own grouped copy of the weights (" +
                                std::to_string(bytes >> 10) + " KiB; ORT_MTP_CPU_PACK=0 turns it off)";
    ORT_CXX_LOG_NOEXCEPT(info.GetLogger(), ORT_LOGGING_LEVEL_INFO, message.c_str());
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) {
    return Guard(where_, [&] { Compute(raw_ctx); });
  }

  void Compute(OrtKernelContext* raw_ctx) {
    Ort::KernelContext ctx{raw_ctx};
    const size_t n_inputs = ctx.GetInputCount();
    auto input = [&](int index) -> Ort::ConstValue {
      return static_cast<size_t>(index) < n_inputs ? ctx.GetInput(index) : Ort::ConstValue{nullptr};
    };
    Ort::ConstValue a = input(kA), b = input(kB), scales = input(kScales);
    Ort::ConstValue zp = input(kZeroPoints), g_idx = input(kGIdx), bias = input(kBias);
    if (g_idx) Fail(where_, "input g_idx is not supported", ORT_NOT_IMPLEMENTED);

    const WeightInfo w{Describe(b), Describe(scales), Describe(zp), Describe(bias)};
    MatMulNBitsProblem p;
    CheckWeights(where_, attrs_, type_, w, p);
    p.weights_constant = weights_constant_;
    p.accuracy_level = static_cast<int>(attrs_.accuracy_level);  // the CPU kernel's choice only

    auto a_info = a.GetTensorTypeAndShapeInfo();
    std::vector<int64_t> a_shape = a_info.GetShape();
    if (a_info.GetElementType() != OnnxType(type_))
      Fail(where_, std::string("input A has type ") + TypeName(a_info.GetElementType()) + ", expected " +
                       TypeName(OnnxType(type_)));
    if (a_shape.empty() || a_shape.back() != attrs_.K)
      Fail(where_, "input A has shape " + ShapeToString(a_shape) + "; its last dimension must equal K=" +
                       std::to_string(attrs_.K));
    std::vector<int64_t> y_shape = a_shape;
    y_shape.back() = attrs_.N;
    p.M = ElementCount(a_shape) / attrs_.K;
    Ort::UnownedValue y = ctx.GetOutput(0, y_shape);
    if (p.M == 0) return;  // empty A: empty Y, nothing to compute

    p.a = a.GetTensorRawData();
    p.b = static_cast<const uint8_t*>(b.GetTensorRawData());
    p.scales = scales.GetTensorRawData();
    p.zero_points = zp ? zp.GetTensorRawData() : nullptr;
    p.bias = bias ? bias.GetTensorRawData() : nullptr;
    p.y = y.GetTensorMutableRawData();
    if (!grouped_.b.empty()) {  // the kernel's own copy of the (constant) weights: PackForCpu
      p.b = grouped_.b.data();
      p.scales = grouped_.scales.data();
      if (p.zero_points) p.zero_points = grouped_.zero_points.data();
      p.layout = WeightLayout::kCpuGroups;
    }

    if (cuda_) {
#ifdef ORT_MTP_WITH_CUDA
      if (const char* error = MatMulNBitsCuda(p, ctx.GetGPUComputeStream())) Fail(where_, error, ORT_FAIL);
#endif
      return;
    }
    MatMulNBitsCpu(
        p,
        [](void* c, void (*fn)(void*, size_t), size_t n, void* user) {
          static_cast<Ort::KernelContext*>(c)->ParallelFor(fn, n, 0, user);
        },
        &ctx);
  }

  std::string where_;
  Attrs attrs_;
  ElemType type_;
  bool cuda_;
  bool weights_constant_ = false;  // B, scales and zero_points (if any) are initializers
  CpuGroupedWeights grouped_;  // PackForCpu's copy, or empty
};

template <ElemType kType, bool kCuda>
struct MatMulNBitsOp : Ort::CustomOpBase<MatMulNBitsOp<kType, kCuda>, MatMulNBitsKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return Guard(kOpName, [&] { *kernel = new MatMulNBitsKernel(info, kType, kCuda); });
  }
  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return kCuda ? "CUDAExecutionProvider" : "CPUExecutionProvider"; }

  size_t GetInputTypeCount() const { return kInputCount; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    switch (index) {
      case kA:
      case kScales:
      case kBias: return OnnxType(kType);
      case kB: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
      default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // zero_points: uint8 or T; g_idx: rejected
    }
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index <= kScales ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 1; }
  // A typed output: ORT refuses a graph that declares Y with another type, and a bound Y of another
  // type or shape, before Compute runs (tests/op_fuzz.py's Y_dtype cases), so Y is always M x N of A's type.
  ONNXTensorElementDataType GetOutputType(size_t) const { return OnnxType(kType); }
};

}  // namespace

void AddMatMulNBitsOps(Ort::CustomOpDomain& domain, bool with_cuda) {
  static MatMulNBitsOp<ElemType::kFloat32, false> cpu_f32;
  static MatMulNBitsOp<ElemType::kFloat16, false> cpu_f16;
  static MatMulNBitsOp<ElemType::kBFloat16, false> cpu_bf16;
  domain.Add(&cpu_f32);
  domain.Add(&cpu_f16);
  domain.Add(&cpu_bf16);
#ifdef ORT_MTP_WITH_CUDA
  if (with_cuda) {
    static MatMulNBitsOp<ElemType::kFloat32, true> cuda_f32;
    static MatMulNBitsOp<ElemType::kFloat16, true> cuda_f16;
    static MatMulNBitsOp<ElemType::kBFloat16, true> cuda_bf16;
    domain.Add(&cuda_f32);
    domain.Add(&cuda_f16);
    domain.Add(&cuda_bf16);
  }
#endif
}

}  // namespace ort_mtp
