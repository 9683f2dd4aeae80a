#include "ops/registry.h"

#include <atomic>
#include <iterator>

namespace megakern {

// The entries, each defined in its family's file (ops/*.cpp).
extern const OpInfo kEmbedOp, kMatMulOp, kRmsNormOp, kResidualOp, kGatedResidualOp, kGatedRmsNormOp, kHeadNormGateOp,
    kHeadNormRopeOp, kStoreKVOp, kAttentionOp, kMlaKeyOp, kGluActOp, kSigmoidGateOp, kLogitSoftcapOp,
    kCausalConvSiluOp, kDeltaRuleOp, kMoeRouteOp, kMoeGluOp, kMoeDownOp, kMoeCombineOp, kAttnResMixOp,
    kAttnResAddOp, kAllReduceOp, kAllGatherOp, kTapOp;

namespace {

const OpInfo* const kTable[] = {
    &kEmbedOp,         &kRmsNormOp,      &kMatMulOp,       &kHeadNormRopeOp,  &kStoreKVOp,       &kAttentionOp,
    &kGluActOp,        &kResidualOp,     &kSigmoidGateOp,  &kCausalConvSiluOp, &kDeltaRuleOp,    &kGatedRmsNormOp,
    &kGatedResidualOp, &kHeadNormGateOp, &kLogitSoftcapOp, &kMoeRouteOp,      &kMoeGluOp,        &kMoeDownOp,
    &kMoeCombineOp,    &kAttnResMixOp,   &kAttnResAddOp,   &kMlaKeyOp,        &kAllReduceOp,
    &kAllGatherOp,     &kTapOp,
};
static_assert(std::size(kTable) == kOpKinds);

}  // namespace

const OpInfo& op_info(OpKind k) { return *kTable[static_cast<size_t>(k)]; }

uint64_t next_step_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace megakern
