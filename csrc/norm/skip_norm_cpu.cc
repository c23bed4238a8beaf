// CPU kernel of SkipSimplifiedLayerNormalization (skip_norm.h has the arithmetic): rows in tasks over
// ORT's thread pool, each row in ascending j in float32 (no fused multiply-add: the file is compiled
// with -ffp-contract=off), so neither M nor the thread count changes a result.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu_numeric.h"
#include "norm/skip_norm.h"

namespace ort_mtp {
namespace {

template <typename T>
struct Rows {
  const SkipNormProblem& p;
  int64_t per_task;

  void Run(int64_t task) {
    const int64_t H = p.hidden, end = std::min(p.rows, (task + 1) * per_task);
    const T* gamma = static_cast<const T*>(p.gamma);
    const T* bias = static_cast<const T*>(p.bias);
    std::vector<float> s(static_cast<size_t>(H));
    for (int64_t m = task * per_task; m < end; ++m) {
      const T* x = static_cast<const T*>(p.input) + m * H;
      const T* r = static_cast<const T*>(p.skip) + m * H;
      T* y = static_cast<T*>(p.y) + m * H;
      T* sum = p.sum ? static_cast<T*>(p.sum) + m * H : nullptr;
      float ss = 0.f;
      for (int64_t j = 0; j < H; ++j) {
        float v = static_cast<float>(cpu::ToDouble(x[j])) + static_cast<float>(cpu::ToDouble(r[j]));
        if (bias) v += static_cast<float>(cpu::ToDouble(bias[j]));
        const T t = cpu::Round<T>(v);
        if (sum) sum[j] = t;
        s[j] = static_cast<float>(cpu::ToDouble(t));
        ss += s[j] * s[j];
      }
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + p.epsilon);
      for (int64_t j = 0; j < H; ++j) y[j] = cpu::Round<T>(s[j] * inv * static_cast<float>(cpu::ToDouble(gamma[j])));
    }
  }
};

template <typename T>
void Run(const SkipNormProblem& p, ParallelFor parallel_for, void* context) {
  // About 64 Ki elements per task: a decode step's few rows stay on one thread.
  Rows<T> rows{p, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, p.hidden))};
  cpu::ForEach<Rows<T>, &Rows<T>::Run>(rows, (p.rows + rows.per_task - 1) / rows.per_task, parallel_for, context);
}

}  // namespace

void SkipNormCpu(const SkipNormProblem& p, ParallelFor parallel_for, void* parallel_context) {
  cpu::WithElementType(p.type, [&](auto t) { Run<decltype(t)>(p, parallel_for, parallel_context); });
}

}  // namespace ort_mtp
