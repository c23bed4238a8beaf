// CopySlots(slots, src_0, dst_0, src_1, dst_1, ...) -> (out_0, out_1, ...)
//
// For each pair, out_i is dst_i with one slot replaced by one slot of src_i, where a slot is an index
// of the leading axis (a state_window state [W, ...] has W slots):
//     out_i = dst_i;  out_i[dst_slot] = src_i[src_slot]
// slots is an int64 tensor [2] = (src_slot, dst_slot), read in host memory; (-1, -1) copies whole
// tensors (out_i = src_i, same shapes), which is how state is snapshot and restored.
// Bound with IOBinding so that out_i is dst_i's own buffer, only the slot's bytes move; otherwise the
// rest of dst_i is copied into out_i first, so the result is the same either way.
// All pairs are copied in one batch (one CUDA launch per kMaxRangesPerLaunch ranges) on the
// session's compute stream, with no host synchronisation.
#include "copy_slots/copy_slots.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/validate.h"
#include "ops.h"

namespace ort_mtp {
namespace {

constexpr const char* kOpName = "CopySlots";

struct CopySlotsKernel {
  CopySlotsKernel(const OrtKernelInfo* raw_info, bool cuda) : cuda_(cuda) {
    Ort::ConstKernelInfo info{raw_info};
    where_ = NodeLabel(kOpName, info.GetNodeName());
    const size_t n_inputs = info.GetInputCount();
    if (n_inputs < 3 || (n_inputs - 1) % 2 != 0)
      Fail(where_, "expects slots followed by (src, dst) pairs: an odd number of inputs >= 3, got " +
                       std::to_string(n_inputs));
    const size_t pairs = (n_inputs - 1) / 2;
    if (info.GetOutputCount() != pairs)
      Fail(where_, "has " + std::to_string(pairs) + " (src, dst) pairs but " + std::to_string(info.GetOutputCount()) +
                       " outputs; it needs one output per pair");
    for (size_t i = 1; i < n_inputs; ++i) input_names_.push_back(info.GetInputName(i));
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) {
    return Guard(where_, [&] { Compute(raw_ctx); });
  }

  std::string PairLabel(size_t i) const {
    return "pair " + std::to_string(i) + " ('" + input_names_[2 * i] + "' -> '" + input_names_[2 * i + 1] + "')";
  }

  // ORT sizes an output from its declared element type (a variadic output has no type constraint), so
  // a graph that declares out_i as uint8 beside a float32 pair gets a buffer a quarter of the bytes
  // this op writes. Every size below is taken from dst_i, so out_i must match it in type and shape.
  void CheckOutput(size_t i, const Ort::UnownedValue& out, ONNXTensorElementDataType type,
                   const std::vector<int64_t>& shape) const {
    auto info = out.GetTensorTypeAndShapeInfo();
    if (info.GetElementType() != type)
      Fail(where_, PairLabel(i) + ": output " + std::to_string(i) + " is declared " +
                       TypeName(info.GetElementType()) + " but the pair is " + TypeName(type) +
                       "; an output must have its dst's type");
    if (info.GetShape() != shape)
      Fail(where_, PairLabel(i) + ": output " + std::to_string(i) + " has shape " + ShapeToString(info.GetShape()) +
                       " but dst has " + ShapeToString(shape));
  }

  void Compute(OrtKernelContext* raw_ctx) {
    Ort::KernelContext ctx{raw_ctx};
    Ort::ConstValue slots = ctx.GetInput(0);
    auto slots_info = slots.GetTensorTypeAndShapeInfo();
    if (slots_info.GetElementCount() != 2)
      Fail(where_, "input slots must hold 2 int64 values (src_slot, dst_slot), got shape " +
                       ShapeToString(slots_info.GetShape()));
    const int64_t* slot_values = slots.GetTensorData<int64_t>();
    const int64_t src_slot = slot_values[0], dst_slot = slot_values[1];
    const bool whole = src_slot == -1 && dst_slot == -1;
    if (!whole && (src_slot < 0 || dst_slot < 0))
      Fail(where_, "slots must be (-1, -1) for whole tensors or two slot indices >= 0, got (" +
                       std::to_string(src_slot) + ", " + std::to_string(dst_slot) + ")");

    const size_t pairs = input_names_.size() / 2;
    std::vector<CopyRange> ranges;
    ranges.reserve(pairs * 3);
    for (size_t i = 0; i < pairs; ++i) {
      Ort::ConstValue src = ctx.GetInput(1 + 2 * i);
      Ort::ConstValue dst = ctx.GetInput(2 + 2 * i);
      auto src_info = src.GetTensorTypeAndShapeInfo();
      auto dst_info = dst.GetTensorTypeAndShapeInfo();
      const std::vector<int64_t> src_shape = src_info.GetShape(), dst_shape = dst_info.GetShape();
      const ONNXTensorElementDataType type = src_info.GetElementType();
      const size_t elem = TypeSize(type);
      if (elem == 0) Fail(where_, PairLabel(i) + ": unsupported element type " + TypeName(type));
      if (dst_info.GetElementType() != type)
        Fail(where_, PairLabel(i) + ": src is " + TypeName(type) + " but dst is " + TypeName(dst_info.GetElementType()));
      Ort::UnownedValue out = ctx.GetOutput(i, dst_shape);
      CheckOutput(i, out, type, dst_shape);
      const auto* src_ptr = static_cast<const unsigned char*>(src.GetTensorRawData());
      const auto* dst_ptr = static_cast<const unsigned char*>(dst.GetTensorRawData());
      auto* out_ptr = static_cast<unsigned char*>(out.GetTensorMutableRawData());
      const uint64_t total = static_cast<uint64_t>(ElementCount(dst_shape)) * elem;
      if (whole) {
        if (src_shape != dst_shape)
          Fail(where_, PairLabel(i) + ": a whole-tensor copy needs equal shapes, got " + ShapeToString(src_shape) +
                           " and " + ShapeToString(dst_shape));
        if (src_ptr != out_ptr) ranges.push_back({src_ptr, out_ptr, total});
        continue;
      }
      if (src_shape.empty() || dst_shape.empty())
        Fail(where_, PairLabel(i) + ": slot copies need tensors of rank >= 1 (slots on the leading axis)");
      if (!std::equal(src_shape.begin() + 1, src_shape.end(), dst_shape.begin() + 1, dst_shape.end()))
        Fail(where_, PairLabel(i) + ": src " + ShapeToString(src_shape) + " and dst " + ShapeToString(dst_shape) +
                         " differ beyond the leading (slot) axis");
      if (src_slot >= src_shape[0] || dst_slot >= dst_shape[0])
        Fail(where_, PairLabel(i) + ": slots (" + std::to_string(src_slot) + ", " + std::to_string(dst_slot) +
                         ") out of range for leading dims " + std::to_string(src_shape[0]) + " and " +
                         std::to_string(dst_shape[0]));
      const uint64_t slot_bytes = dst_shape[0] ? total / static_cast<uint64_t>(dst_shape[0]) : 0;
      const uint64_t dst_offset = static_cast<uint64_t>(dst_slot) * slot_bytes;
      if (out_ptr != dst_ptr) {  // not bound in place: carry the rest of dst over
        ranges.push_back({dst_ptr, out_ptr, dst_offset});
        ranges.push_back({dst_ptr + dst_offset + slot_bytes, out_ptr + dst_offset + slot_bytes,
                          total - dst_offset - slot_bytes});
      }
      const unsigned char* from = src_ptr + static_cast<uint64_t>(src_slot) * slot_bytes;
      if (from != out_ptr + dst_offset) ranges.push_back({from, out_ptr + dst_offset, slot_bytes});
    }

    if (cuda_) {
#ifdef ORT_MTP_WITH_CUDA
      if (const char* error = CopyRangesCuda(ranges.data(), ranges.size(), ctx.GetGPUComputeStream()))
        Fail(where_, error, ORT_FAIL);
#endif
      return;
    }
    for (const CopyRange& r : ranges) std::memmove(r.dst, r.src, r.bytes);
  }

  std::string where_;
  std::vector<std::string> input_names_;  // the tensor inputs, in order (src_0, dst_0, ...)
  bool cuda_;
};

template <bool kCuda>
struct CopySlotsOp : Ort::CustomOpBase<CopySlotsOp<kCuda>, CopySlotsKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return Guard(kOpName, [&] { *kernel = new CopySlotsKernel(info, kCuda); });
  }
  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return kCuda ? "CUDAExecutionProvider" : "CPUExecutionProvider"; }

  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  }
  // The slot indices are read by the host to build the copy list, so they live in host memory.
  OrtMemType GetInputMemoryType(size_t index) const { return index == 0 ? OrtMemTypeCPUInput : OrtMemTypeDefault; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_VARIADIC;
  }
  int GetVariadicInputMinArity() const { return 2; }
  bool GetVariadicInputHomogeneity() const { return false; }

  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_VARIADIC; }
  int GetVariadicOutputMinArity() const { return 1; }
  bool GetVariadicOutputHomogeneity() const { return false; }
};

}  // namespace

void AddCopySlotsOps(Ort::CustomOpDomain& domain, bool with_cuda) {
  static CopySlotsOp<false> cpu;
  domain.Add(&cpu);
#ifdef ORT_MTP_WITH_CUDA
  if (with_cuda) {
    static CopySlotsOp<true> cuda;
    domain.Add(&cuda);
  }
#endif
}

}  // namespace ort_mtp

// The op's batch copy for a caller that holds the tensors' addresses itself, without an ORT run: the
// driver's slot promotion (driver/copy_slots.py, through ctypes) after every partly accepted MTP
// round. A one-node session's run is ORT's per-run host work around a copy that takes the device tens
// of microseconds, and the GPU has nothing else queued while the host does that work (the round has
// just synchronised to read the accepted count). `ranges` is `count` records of (const void* src,
// void* dst, uint64_t bytes), 24 bytes each (ort_mtp::CopyRange), that do not overlap; `cuda` nonzero:
// device pointers, copied on `stream` (a cudaStream_t; null: the legacy default stream); zero: host
// pointers, copied by memmove. Returns null on success, else a message saying what failed (static
// storage: the caller does not free it).
extern "C" __attribute__((visibility("default"))) const char* OrtMtpCopyRanges(const void* ranges, uint64_t count,
                                                                              int cuda, void* stream) {
  static_assert(sizeof(ort_mtp::CopyRange) == 24, "the C entry's record layout");
  if (count == 0) return nullptr;
  if (ranges == nullptr) return "OrtMtpCopyRanges: ranges is null but count is not 0";
  const auto* list = static_cast<const ort_mtp::CopyRange*>(ranges);
  if (cuda) {
#ifdef ORT_MTP_WITH_CUDA
    return ort_mtp::CopyRangesCuda(list, count, stream);
#else
    return "OrtMtpCopyRanges: this library was built without CUDA kernels";
#endif
  }
  for (uint64_t i = 0; i < count; ++i) std::memmove(list[i].dst, list[i].src, list[i].bytes);
  return nullptr;
}
