// How the CPU kernels spread work over ONNX Runtime's intra-op thread pool without depending on the ORT
// API: parallel_for(context, fn, n_tasks, user) runs fn(user, i) for every i < n_tasks, in any order and
// on any threads; a kernel given nullptr runs its tasks serially. The ops pass KernelParallelFor (ort.h)
// with their Ort::KernelContext as the context.
#pragma once
#include <cstddef>

namespace ort_mtp {

using ParallelFor = void (*)(void* context, void (*fn)(void*, size_t), size_t n_tasks, void* user);

}  // namespace ort_mtp
