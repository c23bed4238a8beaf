// The floating-point element types the ops' float kernels take (activations, weights, states), shared
// by their problem descriptions, which the CUDA sources include too (so no ONNX Runtime header here:
// validate.h maps them to ONNX element types).
#pragma once

namespace ort_mtp {

enum class FloatType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

}  // namespace ort_mtp
