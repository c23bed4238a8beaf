// Single include point for the ONNX Runtime C++ API. The library is built with
// ORT_API_MANUAL_INIT: the API table is initialised in RegisterCustomOps from the host's OrtApiBase,
// so one build runs under any ONNX Runtime whose API version is at least the headers'.
#pragma once
#include <onnxruntime_cxx_api.h>

#include "common/parallel.h"

namespace ort_mtp {

// The ops' ParallelFor (common/parallel.h): `context` is the call's Ort::KernelContext, whose ParallelFor
// runs the tasks on the session's intra-op thread pool.
inline void KernelParallelFor(void* context, void (*fn)(void*, size_t), size_t n_tasks, void* user) {
  static_cast<Ort::KernelContext*>(context)->ParallelFor(fn, n_tasks, 0, user);
}

}  // namespace ort_mtp
