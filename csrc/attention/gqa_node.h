// What the GroupQueryAttention and GatedAttention ops share as ORT nodes: GroupQueryAttention's attributes,
// and the checks that turn its seven inputs (query, key, value, past_key, past_value, seqlens_k,
// total_sequence_length) into a GroupQueryAttentionProblem with outputs 0..2 (output, present_key,
// present_value) allocated. GatedAttention (gated_attention.cc) computes its query, key and value from one
// packed projection and hands them in here, so both ops check and run the attention one way.
#pragma once
#include <array>
#include <string>

#include "attention/group_query_attention.h"
#include "common/validate.h"

namespace ort_mtp {

struct GqaAttrs {
  int64_t num_heads = 0, kv_num_heads = 0, local_window = -1;
  float scale = 0.f, softcap = 0.f;
  bool smooth_softmax = false;
};
// num_heads, kv_num_heads, scale, softcap, local_window_size, smooth_softmax (and do_rotary = 0).
GqaAttrs ReadGqaAttrs(const Ort::ConstKernelInfo& info, const std::string& where);

constexpr int kGqaInputCount = 7;
struct GqaInputs {
  std::array<TensorDesc, kGqaInputCount> desc;
  std::array<const void*, kGqaInputCount> data{};
  void Set(int i, const Ort::ConstValue& v);
};

// Checks the inputs' types and shapes against the attributes, allocates and checks outputs 0..2 of ctx,
// checks the shared-buffer binding and (cuda = false) every seqlens_k position against the cache; returns
// the problem (batch 0: nothing to compute). Fails with an error naming `where`.
GroupQueryAttentionProblem PrepareGqa(Ort::KernelContext& ctx, const std::string& where, const GqaAttrs& at,
                                      FloatType type, const GqaInputs& in, bool cuda);
// GroupQueryAttentionCpu on ctx's intra-op thread pool.
void RunGqaCpu(Ort::KernelContext& ctx, const GroupQueryAttentionProblem& p);

}  // namespace ort_mtp
