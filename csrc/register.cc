// Library entry point: ONNX Runtime calls RegisterCustomOps when a session's options load this
// library (SessionOptions.register_custom_ops_library in Python, RegisterCustomOpsLibrary in C/C++,
// "custom_ops_library" in onnxruntime-genai's genai_config.json).
#include <memory>
#include <mutex>
#include <vector>

#include "ops.h"

namespace {

// The domain must outlive every session that uses it, so it is created once and never freed.
Ort::CustomOpDomain* Domain() {
  static Ort::CustomOpDomain* domain = [] {
    auto* d = new Ort::CustomOpDomain(ort_mtp::kDomain);
#ifdef ORT_MTP_WITH_CUDA
    constexpr bool with_cuda = true;
#else
    constexpr bool with_cuda = false;
#endif
    ort_mtp::AddMatMulNBitsOps(*d, with_cuda);
    ort_mtp::AddCopySlotsOps(*d, with_cuda);
    ort_mtp::AddGatedDeltaNetOps(*d, with_cuda);
    ort_mtp::AddGroupQueryAttentionOps(*d, with_cuda);
    ort_mtp::AddFloatMatMulOps(*d, with_cuda);
    ort_mtp::AddGatedAttentionOps(*d, with_cuda);
    ort_mtp::AddSkipNormOps(*d, with_cuda);
    return d;
  }();
  return domain;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // The host runtime is older than the headers this library was built against.
    return api_base->GetApi(1)->CreateStatus(
        ORT_FAIL, "ort_mtp: this ONNX Runtime is older than the API version the library needs");
  }
  Ort::InitApi(api);
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  return api->AddCustomOpDomain(options, *Domain());
}
