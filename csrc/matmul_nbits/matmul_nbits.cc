// The MatMulNBits custom op: attribute and shape validation, and dispatch to the CPU or CUDA kernel.
// One op class per (activation type, execution provider); ONNX Runtime merges them into one schema
// with the union of their type constraints.
//
// Beyond com.microsoft's inputs (A, B, scales, zero_points, g_idx, bias) a node may carry a second
// weight set on the same A: B2, scales2, zero_points2, bias2 (inputs 6-9), with N2 columns (attribute
// N2; every other attribute is shared, and zero_points2 is given exactly when zero_points is). Then
//   activation absent:      Y = A x B1 (+ bias), Y2 = A x B2 (+ bias2), each bit for bit what a
//                           one-weight node computes (two projections of one input in one node);
//   activation = "swiglu":  N2 = N, one output Y = silu(A x B1 + bias) * (A x B2 + bias2), a gated MLP's
//                           gate and up projections with its activation (matmul_nbits.h, PairEpilogue).
// Both EPs run the two-weight forms (ops/mlp.py rewrites a gated MLP onto the swiglu one): the CPU as
// one job over both sets, CUDA as two launches, the second storing the activation over the first's
// outputs (MatMulNBitsCudaPair); the activation is silu_mul.h's SiluMul on both.
#include "matmul_nbits/matmul_nbits.h"

#include <cstdio>
#include <memory>
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
enum Input {
  kA = 0, kB = 1, kScales = 2, kZeroPoints = 3, kGIdx = 4, kBias = 5,
  kB2 = 6, kScales2 = 7, kZeroPoints2 = 8, kBias2 = 9, kInputCount = 10
};
// The input indices of one weight set (set 1 has g_idx between zero_points and bias, set 2 does not).
struct SetInputs {
  int b, scales, zero_points, bias;
};
constexpr SetInputs kSetInputs[2] = {{kB, kScales, kZeroPoints, kBias}, {kB2, kScales2, kZeroPoints2, kBias2}};

struct Attrs {
  int64_t K = 0, N = 0, bits = 0, block_size = 0, accuracy_level = 0;
  int64_t packing = 0;  // WeightLayout: 0 row-major (com.microsoft's), 1 tiles (ops.packing wrote B and scales)
  int64_t N2 = 0;       // columns of the second weight set (0: none)
  bool swiglu = false;  // activation = "swiglu"
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
  const std::string activation = StringAttr(info, where, "activation", "");
  if (!activation.empty() && activation != "swiglu")
    Fail(where, "attribute activation='" + activation + "' is not supported (\"swiglu\", or absent)",
         ORT_NOT_IMPLEMENTED);
  a.swiglu = activation == "swiglu";
  a.N2 = OptionalInt(info, where, "N2", a.swiglu ? a.N : 0);
  if (a.N2 < 0 || a.N2 > kMaxDim)
    Fail(where, "attribute N2 must be in [0, " + std::to_string(kMaxDim) + "], got " + std::to_string(a.N2));
  if (a.swiglu && a.N2 != a.N)
    Fail(where, "activation='swiglu' needs a second weight set of N columns (N2=N=" + std::to_string(a.N) +
                    "), got N2=" + std::to_string(a.N2));
  if (a.N2 > 0 && a.packing == 1 && a.N2 % kTileRows != 0)
    Fail(where, "packing=1 (tiles) needs N2 a multiple of 16, got N2=" + std::to_string(a.N2));
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
// `set` is 1 or 2 (inputs B, scales, ... or B2, scales2, ...: messages name them; set 2 has N2 columns).
// It runs on every call, so the messages' strings are only built on the way to a failure.
void CheckWeights(const std::string& where, const Attrs& at, FloatType type, const WeightInfo& w,
                  MatMulNBitsProblem& p, int set = 1) {
  const char* sfx = set == 1 ? "" : "2";
  auto input = [&](const char* name) { return std::string("input ") + name + sfx; };
  const int64_t N = set == 1 ? at.N : at.N2;
  p.N = N;
  p.K = at.K;
  p.bits = static_cast<int>(at.bits);
  p.block_size = static_cast<int>(at.block_size);
  p.k_blocks = (at.K + at.block_size - 1) / at.block_size;
  p.block_bytes = at.block_size * at.bits / 8;
  p.zp_row_bytes = (p.k_blocks * at.bits + 7) / 8;
  p.type = type;
  p.layout = at.packing == 1 ? WeightLayout::kTiles : WeightLayout::kRowMajor;
  if (at.packing == 1 && type == FloatType::kFloat32)
    Fail(where, "packing=1 (tiles) needs float16 or bfloat16 activations, got float");
  const char* t = TypeName(OnnxType(type));
  auto kn = [&] {
    return " for K=" + std::to_string(at.K) + ", N" + sfx + "=" + std::to_string(N) +
           ", block_size=" + std::to_string(at.block_size) + ", bits=" + std::to_string(at.bits);
  };
  if (w.b.present) {
    if (w.b.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      Fail(where, input("B") + " must be uint8, got " + TypeName(w.b.type));
    const bool rank3 = w.b.shape.size() == 3 && w.b.shape[0] == N && w.b.shape[1] == p.k_blocks &&
                       w.b.shape[2] == p.block_bytes;
    if (!rank3 && !IsMatrix(w.b.shape, N, p.k_blocks * p.block_bytes))
      Fail(where, input("B") + " has shape " + ShapeToString(w.b.shape) + ", expected " +
                      ShapeToString({N, p.k_blocks, p.block_bytes}) + kn());
  }
  if (w.scales.present) {
    if (w.scales.type != OnnxType(type))
      Fail(where, input("scales") + " must have A's type " + std::string(t) + ", got " + TypeName(w.scales.type));
    if (!IsMatrix(w.scales.shape, N, p.k_blocks))
      Fail(where, input("scales") + " has shape " + ShapeToString(w.scales.shape) + ", expected " +
                      ShapeToString({N, p.k_blocks}) + " or " + ShapeToString({N * p.k_blocks}) + kn());
  }
  p.zp_kind = ZeroPointKind::kNone;
  if (w.zp.present) {
    if (w.zp.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8) {
      p.zp_kind = ZeroPointKind::kPacked;
      if (!IsMatrix(w.zp.shape, N, p.zp_row_bytes))
        Fail(where, input("zero_points") + " (uint8, packed) has shape " + ShapeToString(w.zp.shape) + ", expected " +
                        ShapeToString({N, p.zp_row_bytes}) + " or " + ShapeToString({N * p.zp_row_bytes}) + kn());
    } else if (w.zp.type == OnnxType(type)) {
      p.zp_kind = ZeroPointKind::kTyped;
      if (!IsMatrix(w.zp.shape, N, p.k_blocks))
        Fail(where, input("zero_points") + " (" + std::string(t) + ") has shape " + ShapeToString(w.zp.shape) + ", expected " +
                        ShapeToString({N, p.k_blocks}) + " or " + ShapeToString({N * p.k_blocks}) + kn());
    } else {
      Fail(where, input("zero_points") + " must be uint8 or A's type " + std::string(t) + ", got " + TypeName(w.zp.type));
    }
  }
  if (w.bias.present) {
    if (w.bias.type != OnnxType(type))
      Fail(where, input("bias") + " must have A's type " + std::string(t) + ", got " + TypeName(w.bias.type));
    if (w.bias.shape.size() != 1 || w.bias.shape[0] != N)
      Fail(where, input("bias") + " has shape " + ShapeToString(w.bias.shape) + ", expected " + ShapeToString({N}));
  }
}

struct MatMulNBitsKernel {
  MatMulNBitsKernel(const OrtKernelInfo* raw_info, FloatType type, bool cuda) : type_(type), cuda_(cuda) {
    Ort::ConstKernelInfo info{raw_info};
    where_ = NodeLabel(kOpName, info.GetNodeName());
    attrs_ = ReadAttrs(info, where_);
    const size_t n_inputs = info.GetInputCount();
    auto given = [&](int index) { return static_cast<size_t>(index) < n_inputs && !info.GetInputName(index).empty(); };
    if (given(kGIdx))
      Fail(where_, "input g_idx (act-order / grouped index) is not supported; export without act-order",
           ORT_NOT_IMPLEMENTED);
    // Any zero_points input, constant or not, so Compute never meets one with packing=1.
    if (attrs_.packing == 1 && given(kZeroPoints))
      Fail(where_, "packing=1 (tiles) does not take zero_points (symmetric weights only)");
    two_ = attrs_.N2 > 0;
    if (two_) {
      if (!given(kB2) || !given(kScales2)) Fail(where_, "N2 > 0 needs inputs B2 and scales2");
      if (given(kZeroPoints) != given(kZeroPoints2))
        Fail(where_, "zero_points2 must be given exactly when zero_points is (the two weight sets share A's quantisation)");
    } else {
      for (int i = kB2; i <= kBias2; ++i)
        if (given(i)) Fail(where_, "inputs B2, scales2, zero_points2 and bias2 need attribute N2 > 0");
    }
    const size_t want_outputs = two_ && !attrs_.swiglu ? 2 : 1;
    const size_t n_outputs = info.GetOutputCount();
    if (n_outputs != want_outputs || (n_outputs == 2 && info.GetOutputName(1).empty()))
      Fail(where_, std::string("has ") + std::to_string(n_outputs) + " outputs, expected " +
                       (want_outputs == 2 ? "2 (Y, Y2: N2 > 0 without an activation)" : "1 (Y)"));
    // Validate initializer shapes now, so a bad model fails at session creation.
    auto constant = [&](int index) -> TensorDesc {
      if (!given(index)) return {};
      int is_constant = 0;
      Ort::ConstValue v = info.GetTensorConstantInput(index, &is_constant);
      return is_constant ? Describe(v) : TensorDesc{};
    };
    for (int set = 1; set <= (two_ ? 2 : 1); ++set) {
      const SetInputs& in = kSetInputs[set - 1];
      const WeightInfo w{constant(in.b), constant(in.scales), constant(in.zero_points), constant(in.bias)};
      MatMulNBitsProblem weights;
      CheckWeights(where_, attrs_, type_, w, weights, set);
      // The CUDA kernel may prefetch constant weights before the previous kernel has finished.
      const bool constant_set = w.b.present && w.scales.present && (!given(in.zero_points) || w.zp.present);
      weights_constant_[set - 1] = constant_set;
      if (!cuda_ && constant_set) PackForCpu(info, weights, given(in.zero_points), set, grouped_[set - 1]);
    }
  }

  // The CPU int8 kernel's copy of constant weights in the kCpuGroups layout (matmul_nbits.h): the
  // order its vector loads read them in, shared with every kernel of the process holding the same
  // bytes (MatMulNBitsCpuPackShared). It costs one more copy of B, scales and zero points in memory
  // for the session's life (ORT keeps the initializers); ORT_MTP_CPU_PACK=0 turns it off and the kernel
  // then gathers each unit from the row-major weights as it goes (the same bits, slower). `set`: 1 or 2.
  void PackForCpu(Ort::ConstKernelInfo& info, MatMulNBitsProblem& p, bool has_zp, int set,
                  std::shared_ptr<const CpuGroupedWeights>& out) {
    p.accuracy_level = static_cast<int>(attrs_.accuracy_level);
    if (!MatMulNBitsCpuPackable(p)) return;
    // Each node's copy is made as its kernel is created, so a model too big to hold twice in memory
    // stops copying (and keeps reading the row-major weights, the same bits) where memory runs short,
    // rather than being killed for running out of it.
    const size_t need = MatMulNBitsCpuPackBytes(p);
    const int64_t available = AvailableMemoryBytes();
    const std::string which = set == 1 ? "" : " (second weight set)";
    const SetInputs& in = kSetInputs[set - 1];
    if (available >= 0 && need > static_cast<size_t>(available) / 2) {
      const std::string message = where_ + which + ": no grouped copy of the weights for the CPU int8 kernel (" +
                                  std::to_string(need >> 10) + " KiB, with " + std::to_string(available >> 20) +
                                  " MiB of memory available): it reads the row-major weights, slower";
      ORT_CXX_LOG_NOEXCEPT(info.GetLogger(), ORT_LOGGING_LEVEL_WARNING, message.c_str());
      return;
    }
    int is_constant = 0;
    p.b = static_cast<const uint8_t*>(info.GetTensorConstantInput(in.b, &is_constant).GetTensorRawData());
    p.scales = info.GetTensorConstantInput(in.scales, &is_constant).GetTensorRawData();
    if (has_zp) p.zero_points = info.GetTensorConstantInput(in.zero_points, &is_constant).GetTensorRawData();
    out = MatMulNBitsCpuPackShared(p);
    const size_t bytes = out->b.size() + out->scales.size() + out->zero_points.size();
    const std::string message = where_ + which + ": the CPU int8 kernel reads a grouped copy of the weights (" +
                                std::to_string(bytes >> 10) + " KiB, " + std::to_string(out.use_count() - 1) +
                                " other kernel(s) of this process sharing it; ORT_MTP_CPU_PACK=0 turns it off)";
    ORT_CXX_LOG_NOEXCEPT(info.GetLogger(), ORT_LOGGING_LEVEL_INFO, message.c_str());
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) {
    return Guard(where_, [&] { Compute(raw_ctx); });
  }

  // Set `set` (1 or 2) of the call's weights, validated, in p (all but a, M and y).
  void Weights(Ort::KernelContext& ctx, int set, MatMulNBitsProblem& p) const {
    const size_t n_inputs = ctx.GetInputCount();
    auto input = [&](int index) -> Ort::ConstValue {
      return static_cast<size_t>(index) < n_inputs ? ctx.GetInput(index) : Ort::ConstValue{nullptr};
    };
    const SetInputs& in = kSetInputs[set - 1];
    Ort::ConstValue b = input(in.b), scales = input(in.scales), zp = input(in.zero_points), bias = input(in.bias);
    const WeightInfo w{Describe(b), Describe(scales), Describe(zp), Describe(bias)};
    if (!w.b.present || !w.scales.present)
      Fail(where_, set == 1 ? "inputs B and scales are required" : "inputs B2 and scales2 are required");
    CheckWeights(where_, attrs_, type_, w, p, set);
    p.weights_constant = weights_constant_[set - 1];
    p.accuracy_level = static_cast<int>(attrs_.accuracy_level);  // the CPU kernel's choice only
    p.b = static_cast<const uint8_t*>(b.GetTensorRawData());
    p.scales = scales.GetTensorRawData();
    p.zero_points = zp ? zp.GetTensorRawData() : nullptr;
    p.bias = bias ? bias.GetTensorRawData() : nullptr;
    if (const CpuGroupedWeights* grouped = grouped_[set - 1].get()) {  // the (constant) weights' copy: PackForCpu
      p.b = grouped->b.data();
      p.scales = grouped->scales.data();
      if (p.zero_points) p.zero_points = grouped->zero_points.data();
      p.layout = WeightLayout::kCpuGroups;
    }
  }

  void Compute(OrtKernelContext* raw_ctx) {
    Ort::KernelContext ctx{raw_ctx};
    const size_t n_inputs = ctx.GetInputCount();
    if (n_inputs > kGIdx && ctx.GetInput(kGIdx)) Fail(where_, "input g_idx is not supported", ORT_NOT_IMPLEMENTED);
    Ort::ConstValue a = ctx.GetInput(kA);
    if (!a) Fail(where_, "input A is required");
    MatMulNBitsProblem p, p2;
    Weights(ctx, 1, p);
    if (two_) Weights(ctx, 2, p2);

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
    p.M = p2.M = ElementCount(a_shape) / attrs_.K;
    Ort::UnownedValue y = ctx.GetOutput(0, y_shape);
    p.a = p2.a = a.GetTensorRawData();
    p.y = y.GetTensorMutableRawData();
    if (two_ && !attrs_.swiglu) {
      y_shape.back() = attrs_.N2;
      p2.y = ctx.GetOutput(1, y_shape).GetTensorMutableRawData();
    }
    if (p.M == 0) return;  // empty A: empty outputs, nothing to compute

    if (cuda_) {
#ifdef ORT_MTP_WITH_CUDA
      void* stream = ctx.GetGPUComputeStream();
      const char* error = two_ ? MatMulNBitsCudaPair(p, p2, attrs_.swiglu ? PairEpilogue::kSwiGlu : PairEpilogue::kNone, stream)
                               : MatMulNBitsCuda(p, stream);
      if (error) Fail(where_, error, ORT_FAIL);
#endif
      return;
    }
    if (two_)
      MatMulNBitsCpuPair(p, p2, attrs_.swiglu ? PairEpilogue::kSwiGlu : PairEpilogue::kNone, KernelParallelFor, &ctx);
    else
      MatMulNBitsCpu(p, KernelParallelFor, &ctx);
  }

  std::string where_;
  Attrs attrs_;
  FloatType type_;
  bool cuda_;
  bool two_ = false;                        // a second weight set (N2 > 0)
  bool weights_constant_[2] = {false, false};  // per set: B, scales and zero_points (if any) are initializers
  std::shared_ptr<const CpuGroupedWeights> grouped_[2];  // per set: PackForCpu's (shared) copy, or null
};

template <FloatType kType, bool kCuda>
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
      case kBias:
      case kScales2:
      case kBias2: return OnnxType(kType);
      case kB:
      case kB2: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
      default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // zero_points(2): uint8 or T; g_idx: rejected
    }
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index <= kScales ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 2; }  // Y, Y2 (optional: the two-weight form without activation)
  // Typed outputs: ORT refuses a graph that declares Y with another type, and a bound Y of another
  // type or shape, before Compute runs (tests/op_fuzz.py's Y_dtype cases), so Y is always M x N of A's type.
  ONNXTensorElementDataType GetOutputType(size_t) const { return OnnxType(kType); }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const {
    return index == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
};

}  // namespace

void AddMatMulNBitsOps(Ort::CustomOpDomain& domain, bool with_cuda) {
  AddFloatTypedOps<MatMulNBitsOp>(domain, with_cuda);
}

}  // namespace ort_mtp
