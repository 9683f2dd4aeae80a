#include "exec/recurrent_kernels.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/registry.h"

namespace megakern {

bool op_is_recurrent(const Op& op) { return op_info(op).recurrent; }

bool rows_chained(const RowInput* rows, int n_rows) {
  for (int r = 1; r < n_rows; ++r)
    if (rows[r].state_in && rows[r].state_in == rows[r - 1].state) return true;
  return false;
}

void validate_recurrent_rows(const DecodeProgram& p, const RowInput* rows, int n_rows) {
  for (int r = 0; r < n_rows; ++r) {
    const RecurrentState* st = rows[r].state;
    if (!st) fail("row {} has no recurrent state ({} has recurrent layers)", r, p.model_name);
    for (int q = 0; q < n_rows; ++q) {
      if (q == r) continue;
      // Rows sharing a state are one sequence's block: adjacent, one cache.
      if (rows[q].state == st && (rows[q].cache != rows[r].cache || (q < r && rows[r - 1].state != st)))
        fail("rows {} and {} write the same recurrent state but are not adjacent rows of one sequence",
             std::min(q, r), std::max(q, r));
      // A row may start from the state of the row just before it (a chain)
      // but not from one another row of the step is still writing.
      if (q != r - 1 && rows[r].state_in && rows[q].state == rows[r].state_in)
        fail("row {} starts from the state row {} writes; only the previous row's state can be continued", r, q);
    }
    // validate_rows has made rows of one cache adjacent at consecutive
    // positions; each one after the first shares the previous one's state
    // (a block) or starts from it (a chain).
    if (r > 0 && rows[r - 1].cache == rows[r].cache && rows[r - 1].state != st && rows[r].state_in != rows[r - 1].state)
      fail("rows {} and {} belong to the same sequence, so row {} must share row {}'s state or start from it "
           "(state_in)",
           r - 1, r, r, r - 1);
    if (r > 0 && rows[r - 1].state == st && rows[r].state_in)
      fail("row {} continues row {}'s block (the same state) and cannot also start from another state", r, r - 1);
    if (r > 0 && rows[r - 1].cache != rows[r].cache && rows[r].state_in)
      fail("row {} starts from another state but does not continue the previous row's sequence", r);
    const RecurrentState* in = rows[r].state_in;
    if (in && (in->n_layer != st->n_layer || in->conv_dim != st->conv_dim || in->conv_hist != st->conv_hist ||
               in->n_v_heads != st->n_v_heads || in->v_dim != st->v_dim || in->k_dim != st->k_dim))
      fail("row {}: the state it starts from and the state it writes have different shapes", r);
    if (r > 0 && rows[r - 1].state == st) continue;  // checked with the block's first row
    for (const Op& op : p.ops) {
      if (!op_info(op).recurrent) continue;
      if (op.cache_layer() >= st->n_layer)
        fail("row {}: recurrent state has {} layers, op '{}' of layer {} needs index {}", r, st->n_layer, op.name,
             op.layer, op.cache_layer());
      if (op.kind == OpKind::CausalConvSilu) {
        const int C = p.slots[static_cast<size_t>(op.out)].width;
        const int K = static_cast<int>(op.as<ops::CausalConvSilu>().taps.size()) / C;
        if (st->conv_dim != C || st->conv_hist != K - 1)
          fail("row {}: recurrent state conv window [{}][{}] does not fit op '{}' ([{}][{}])", r, st->conv_hist,
               st->conv_dim, op.name, K - 1, C);
      } else {
        const auto& a = op.as<ops::DeltaRule>();
        const int Dk = (p.slots[static_cast<size_t>(op.in)].width - a.n_head * a.head_dim) / (2 * a.n_head_kv);
        if (st->n_v_heads != a.n_head || st->v_dim != a.head_dim || st->k_dim != Dk)
          fail("row {}: recurrent state S [{}][{}][{}] does not fit op '{}' ([{}][{}][{}])", r, st->n_v_heads,
               st->v_dim, st->k_dim, op.name, a.n_head, a.head_dim, Dk);
      }
    }
  }
}

}  // namespace megakern
