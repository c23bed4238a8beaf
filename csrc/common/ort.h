// Single include point for the ONNX Runtime C++ API. The library is built with
// ORT_API_MANUAL_INIT: the API table is initialised in RegisterCustomOps from the host's OrtApiBase,
// so one build runs under any ONNX Runtime whose API version is at least the headers'.
#pragma once
#include <onnxruntime_cxx_api.h>
