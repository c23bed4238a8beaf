// Error reporting shared by all ops: every check throws OpError naming the node, and the
// ORT entry points (kernel creation and compute) turn it into an OrtStatus, so a bad model or bad
// input is reported by ONNX Runtime as an error, never a crash.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/float_type.h"
#include "common/ort.h"

namespace ort_mtp {

class OpError : public std::runtime_error {
 public:
  OpError(OrtErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  OrtErrorCode code() const { return code_; }

 private:
  OrtErrorCode code_;
};

// Throws OpError("<op> node '<name>': <what>").
[[noreturn]] void Fail(const std::string& where, const std::string& what,
                       OrtErrorCode code = ORT_INVALID_ARGUMENT);

// "op node 'name'" prefix for messages.
std::string NodeLabel(const char* op, const std::string& node_name);

std::string ShapeToString(const std::vector<int64_t>& shape);
int64_t ElementCount(const std::vector<int64_t>& shape);
const char* TypeName(ONNXTensorElementDataType type);
ONNXTensorElementDataType OnnxType(FloatType type);
size_t TypeSize(ONNXTensorElementDataType type);

// Presence, shape and element type of an input (absent: an optional input not given). The ops check
// these against their attributes and each other, at session creation for initializers and per call.
struct TensorDesc {
  bool present = false;
  std::vector<int64_t> shape;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
};
TensorDesc Describe(const Ort::ConstValue& v);

// `what` (e.g. "input qkv") must have shape `expected`, where -1 matches any extent; `form` names the
// dimensions in the message ("[B, S, num_heads * head_size]").
void CheckShape(const std::string& where, const std::string& what, const TensorDesc& d,
                const std::vector<int64_t>& expected, const char* form);

// Output `what` (e.g. "output y", as ORT allocated it from the graph's declaration) must have the
// element type and shape the op computes; `note` is appended to a type mismatch's message.
void CheckOutput(const std::string& where, const std::string& what, const Ort::UnownedValue& out,
                 ONNXTensorElementDataType type, const std::vector<int64_t>& shape, const std::string& note = "");

// At session creation: the node has the op's inputs and outputs (named in the message: `inputs` and
// `outputs` hold the op's names) and names every input but `optional` (-1: none), which may be empty.
void CheckNodeArity(const Ort::ConstKernelInfo& info, const std::string& where, const std::vector<const char*>& inputs,
                    const std::vector<const char*>& outputs, int optional = -1);
// At each call: the counts ORT passes are the op's (they come from the node, checked at creation).
void CheckCallArity(const Ort::KernelContext& ctx, const std::string& where, size_t inputs, size_t outputs);

// Attributes. A custom-op schema declares no attribute types, so ORT checks none: an attribute given
// with the wrong type (scale=1 as an int) would read as absent and silently take its default, so
// these readers refuse an attribute of the wrong type by name.
bool HasAttribute(const Ort::ConstKernelInfo& info, const char* name);
// The int attribute `name` in [lo, hi]; absent: `fallback`, or an error when fallback is `kRequired`.
constexpr int64_t kRequired = INT64_MIN;
int64_t IntAttr(const Ort::ConstKernelInfo& info, const std::string& where, const char* name, int64_t lo, int64_t hi,
                int64_t fallback = kRequired);
// The required list-of-ints attribute `name`.
std::vector<int64_t> IntsAttr(const Ort::ConstKernelInfo& info, const std::string& where, const char* name);
// The string attribute `name`; absent: `fallback`.
std::string StringAttr(const Ort::ConstKernelInfo& info, const std::string& where, const char* name,
                       const std::string& fallback);
// The float attribute `name`, finite and >= `lo`; absent: `fallback`.
float FloatAttr(const Ort::ConstKernelInfo& info, const std::string& where, const char* name, float fallback,
                float lo);

// Runs f and converts any exception into an OrtStatus (nullptr on success).
template <typename F>
OrtStatusPtr Guard(const std::string& where, F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (const OpError& e) {
    return Ort::GetApi().CreateStatus(e.code(), e.what());
  } catch (const Ort::Exception& e) {
    return Ort::GetApi().CreateStatus(e.GetOrtErrorCode(), (where + ": " + e.what()).c_str());
  } catch (const std::exception& e) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, (where + ": " + e.what()).c_str());
  } catch (...) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, (where + ": unknown error").c_str());
  }
}

}  // namespace ort_mtp
