#include "ops/registry.h"

#include <type_traits>

namespace megakern {

// The entries, each defined in its family's file (ops/*.cpp).
extern const OpInfo kEmbedOp, kMatMulOp, kRmsNormOp, kResidualOp, kGatedResidualOp, kGatedRmsNormOp, kHeadNormGateOp,
    kHeadNormRopeOp, kStoreKVOp, kAttentionOp, kMlaKeyOp, kGluActOp, kSigmoidGateOp, kLogitSoftcapOp,
    kCausalConvSiluOp, kDeltaRuleOp, kMoeRouteOp, kMoeGluOp, kMoeDownOp, kMoeCombineOp, kAttnResMixOp,
    kAttnResAddOp, kTapOp;

namespace {

const OpInfo* const kTable[] = {
    &kEmbedOp,         &kRmsNormOp,      &kMatMulOp,       &kHeadNormRopeOp,  &kStoreKVOp,       &kAttentionOp,
    &kGluActOp,        &kResidualOp,     &kSigmoidGateOp,  &kCausalConvSiluOp, &kDeltaRuleOp,    &kGatedRmsNormOp,
    &kGatedResidualOp, &kHeadNormGateOp, &kLogitSoftcapOp, &kMoeRouteOp,      &kMoeGluOp,        &kMoeDownOp,
    &kMoeCombineOp,    &kAttnResMixOp,   &kAttnResAddOp,   &kMlaKeyOp,        &kTapOp,
};
static_assert(std::size(kTable) == kOpKinds);

}  // namespace

const OpInfo& op_info(OpKind k) { return *kTable[static_cast<size_t>(k)]; }

const char* op_kind_name(OpKind k) {
  return static_cast<int>(k) < kOpKinds ? op_info(k).name : "?";
}

int Op::cache_layer() const {
  const int c = std::visit(
      [](const auto& p) {
        if constexpr (requires { p.cache_index; })
          return p.cache_index;
        else
          return -1;
      },
      params);
  return c >= 0 ? c : layer;
}

size_t Op::weight_bytes() const {
  const OpInfo& i = op_info(kind);
  if (i.weight_bytes) return i.weight_bytes(*this);
  return i.small_weights ? sizeof(float) * i.small_weights(*this).size() : 0;
}

std::vector<int> Op::reads() const {
  std::vector<int> r;
  for (int s : {in, in2, in3})
    if (s >= 0) r.push_back(s);
  const OpInfo& i = op_info(kind);
  if (out >= 0 && i.reads_out && i.reads_out(*this)) r.push_back(out);
  return r;
}

}  // namespace megakern
