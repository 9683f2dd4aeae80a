// Per-tile kernels of Kimi K3's residual-stream and MLA ops (AttnResMix,
// AttnResAdd, MlaKey; see ir/program.h). Row-tiled: t is the row.
#pragma once

#include "ir/program.h"

namespace megakern {

struct StepContext;

void attn_res_mix_tile(const Op& op, const StepContext& ctx, int r);
void attn_res_add_tile(const Op& op, const StepContext& ctx, int r);
void mla_key_tile(const Op& op, const StepContext& ctx, int r);

}  // namespace megakern
