#include "common/validate.h"

#include <cmath>
#include <sstream>

namespace ort_mtp {

void Fail(const std::string& where, const std::string& what, OrtErrorCode code) {
  throw OpError(code, where + ": " + what);
}

std::string NodeLabel(const char* op, const std::string& node_name) {
  return std::string(op) + " node '" + node_name + "'";
}

namespace {
std::string JoinNames(const std::vector<const char*>& names, int optional) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += std::string(i ? ", " : "") + names[i] + (static_cast<int>(i) == optional ? " (may be the empty name)" : "");
  return s;
}
}  // namespace

void CheckNodeArity(const Ort::ConstKernelInfo& info, const std::string& where, const std::vector<const char*>& inputs,
                    const std::vector<const char*>& outputs, int optional) {
  if (info.GetInputCount() != inputs.size())
    Fail(where, "takes " + std::to_string(inputs.size()) + " inputs (" + JoinNames(inputs, optional) + "), got " +
                    std::to_string(info.GetInputCount()));
  if (info.GetOutputCount() != outputs.size())
    Fail(where, "has " + std::to_string(outputs.size()) + " outputs (" + JoinNames(outputs, -1) + "), got " +
                    std::to_string(info.GetOutputCount()));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (static_cast<int>(i) != optional && info.GetInputName(i).empty())
      Fail(where, std::string("input ") + inputs[i] + " is required");
}

void CheckCallArity(const Ort::KernelContext& ctx, const std::string& where, size_t inputs, size_t outputs) {
  if (ctx.GetInputCount() != inputs || ctx.GetOutputCount() != outputs)
    Fail(where, "expects " + std::to_string(inputs) + " inputs and " + std::to_string(outputs) + " outputs");
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

int64_t ElementCount(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

ONNXTensorElementDataType OnnxType(FloatType t) {
  switch (t) {
    case FloatType::kFloat32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case FloatType::kFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case FloatType::kBFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
  }
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

const char* TypeName(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return "uint16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return "int16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return "uint32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return "uint64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    default: return "unsupported type";
  }
}

size_t TypeSize(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return 1;
    default: return 0;
  }
}

TensorDesc Describe(const Ort::ConstValue& v) {
  TensorDesc d;
  if (!v) return d;
  auto info = v.GetTensorTypeAndShapeInfo();
  d.present = true;
  d.shape = info.GetShape();
  d.type = info.GetElementType();
  return d;
}

void CheckShape(const std::string& where, const std::string& what, const TensorDesc& d,
                const std::vector<int64_t>& expected, const char* form) {
  bool ok = d.shape.size() == expected.size();
  for (size_t k = 0; ok && k < expected.size(); ++k) ok = expected[k] < 0 || d.shape[k] == expected[k];
  if (!ok)
    Fail(where, what + " has shape " + ShapeToString(d.shape) + ", expected " + form + " = " + ShapeToString(expected) +
                    " (-1: any)");
}

void CheckOutput(const std::string& where, const std::string& what, const Ort::UnownedValue& out,
                 ONNXTensorElementDataType type, const std::vector<int64_t>& shape, const std::string& note) {
  auto info = out.GetTensorTypeAndShapeInfo();
  if (info.GetElementType() != type)
    Fail(where, what + " is declared " + TypeName(info.GetElementType()) + " but the op computes " + TypeName(type) +
                    note);
  if (info.GetShape() != shape)
    Fail(where, what + " has shape " + ShapeToString(info.GetShape()) + ", expected " + ShapeToString(shape));
}

// ---------------------------------------------------------------------------------------------------
// Attributes

bool HasAttribute(const Ort::ConstKernelInfo& info, const char* name) {
  const OrtApi& api = Ort::GetApi();
  auto ok = [](OrtStatus* raw) { return Ort::Status{raw}.IsOK(); };
  int64_t i = 0;
  float f = 0.f;
  size_t size = 0;
  return ok(api.KernelInfoGetAttribute_int64(info, name, &i)) || ok(api.KernelInfoGetAttribute_float(info, name, &f)) ||
         ok(api.KernelInfoGetAttribute_string(info, name, nullptr, &size)) ||
         ok(api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size)) ||
         ok(api.KernelInfoGetAttributeArray_float(info, name, nullptr, &size));
}

int64_t IntAttr(const Ort::ConstKernelInfo& info, const std::string& where, const char* name, int64_t lo, int64_t hi,
                int64_t fallback) {
  int64_t value = 0;
  if (!Ort::Status{Ort::GetApi().KernelInfoGetAttribute_int64(info, name, &value)}.IsOK()) {
    if (HasAttribute(info, name)) Fail(where, std::string("attribute '") + name + "' must be an int");
    if (fallback == kRequired) Fail(where, std::string("missing required int attribute '") + name + "'");
    return fallback;
  }
  if (value < lo || value > hi)
    Fail(where, std::string("attribute ") + name + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                    "], got " + std::to_string(value));
  return value;
}

std::vector<int64_t> IntsAttr(const Ort::ConstKernelInfo& info, const std::string& where, const char* name) {
  const OrtApi& api = Ort::GetApi();
  size_t size = 0;
  if (!Ort::Status{api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size)}.IsOK()) {
    if (HasAttribute(info, name)) Fail(where, std::string("attribute '") + name + "' must be a list of ints");
    Fail(where, std::string("missing required attribute '") + name + "' (a list of ints)");
  }
  std::vector<int64_t> values(size);
  if (size > 0) Ort::ThrowOnError(api.KernelInfoGetAttributeArray_int64(info, name, values.data(), &size));
  return values;
}

std::string StringAttr(const Ort::ConstKernelInfo& info, const std::string& where, const char* name,
                       const std::string& fallback) {
  const OrtApi& api = Ort::GetApi();
  size_t size = 0;
  if (!Ort::Status{api.KernelInfoGetAttribute_string(info, name, nullptr, &size)}.IsOK()) {
    if (HasAttribute(info, name)) Fail(where, std::string("attribute '") + name + "' must be a string");
    return fallback;
  }
  std::string value(size, '\0');  // size counts the terminating NUL
  Ort::ThrowOnError(api.KernelInfoGetAttribute_string(info, name, value.data(), &size));
  value.resize(size > 0 ? size - 1 : 0);
  return value;
}

float FloatAttr(const Ort::ConstKernelInfo& info, const std::string& where, const char* name, float fallback,
                float lo) {
  float value = 0.f;
  if (!Ort::Status{Ort::GetApi().KernelInfoGetAttribute_float(info, name, &value)}.IsOK()) {
    if (HasAttribute(info, name)) Fail(where, std::string("attribute '") + name + "' must be a float");
    return fallback;
  }
  if (!std::isfinite(value) || value < lo)
    Fail(where, std::string("attribute ") + name + " must be finite and >= " + std::to_string(lo) + ", got " +
                    std::to_string(value));
  return value;
}

}  // namespace ort_mtp
