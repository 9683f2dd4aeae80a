// The collective ops (ir/op_params.h, "ops/collective.cpp"): one tile for all
// of a step's rows, calling the op's communicator (ir/collective.h) once.
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ir/collective.h"
#include "ops/registry.h"

namespace megakern {
namespace {

// Gathers every rank's rows of its in slot ([n_rows][width_p], width_p the
// full width or rank p's share of it) into `all`, rank after rank;
// counts[p]: the floats of rank p's part.
void gather_rows(Communicator& c, const float* in, int n_rows, int total_width, bool equal_widths,
                 std::vector<size_t>& counts, std::vector<float>& all) {
  const int n = c.size();
  counts.resize(static_cast<size_t>(n));
  size_t sum = 0;
  for (int p = 0; p < n; ++p) {
    const int w = equal_widths ? total_width : share_width(total_width, n, p);
    counts[static_cast<size_t>(p)] = static_cast<size_t>(n_rows) * static_cast<size_t>(w);
    sum += counts[static_cast<size_t>(p)];
  }
  all.resize(sum);
  c.all_gather(in, counts.data(), all.data());
}

// out = part 0 + part 1 + ... in rank order, each float summed in that order
// (the scalar and fast tiles are the same: the order is the result).
void all_reduce_tile(const Op& op, const StepContext& ctx, int, int) {
  Communicator& c = *op.as<ops::AllReduce>().comm;
  const int w = width_of(ctx, op.in);
  thread_local std::vector<size_t> counts;
  thread_local std::vector<float> all;
  gather_rows(c, row_of(ctx, op.in, 0), ctx.n_rows, w, true, counts, all);
  const size_t n = counts[0];
  float* out = row_of(ctx, op.out, 0);
  std::memcpy(out, all.data(), sizeof(float) * n);
  for (int p = 1; p < c.size(); ++p) {
    const float* part = all.data() + static_cast<size_t>(p) * n;
    for (size_t i = 0; i < n; ++i) out[i] += part[i];
  }
}

void all_gather_tile(const Op& op, const StepContext& ctx, int, int) {
  Communicator& c = *op.as<ops::AllGather>().comm;
  const int W = width_of(ctx, op.out);
  thread_local std::vector<size_t> counts;
  thread_local std::vector<float> all;
  gather_rows(c, row_of(ctx, op.in, 0), ctx.n_rows, W, false, counts, all);
  const float* part = all.data();
  for (int p = 0; p < c.size(); ++p) {
    const int b = share_begin(W, c.size(), p), w = share_width(W, c.size(), p);
    for (int r = 0; r < ctx.n_rows; ++r)
      std::memcpy(row_of(ctx, op.out, r) + b, part + static_cast<size_t>(r) * w, sizeof(float) * w);
    part += counts[static_cast<size_t>(p)];
  }
}

int one_tile(const Op&, int, int) { return 1; }
size_t no_weights(const Op&) { return 0; }

}  // namespace

extern const OpInfo kAllReduceOp = {
    .name = "all_reduce",
    .row_tiled = false,
    .tile_count = one_tile,
    .weight_bytes = no_weights,
    .verify = [](const Op& op, const VerifyContext& v) {
      MK_CHECK(op.as<ops::AllReduce>().comm != nullptr, "{}: no communicator", v.where);
      MK_CHECK(op.in >= 0 && op.in != op.out && v.width(op.in) == v.width(op.out),
               "{}: sums a slot of {} into one of {} (needs two distinct slots of one width)", v.where,
               op.in >= 0 ? v.width(op.in) : 0, v.width(op.out));
    },
    .ref = all_reduce_tile,
    .fast = all_reduce_tile,
};

extern const OpInfo kAllGatherOp = {
    .name = "all_gather",
    .row_tiled = false,
    .tile_count = one_tile,
    .weight_bytes = no_weights,
    .verify = [](const Op& op, const VerifyContext& v) {
      const Communicator* c = op.as<ops::AllGather>().comm;
      MK_CHECK(c != nullptr, "{}: no communicator", v.where);
      MK_CHECK(op.in >= 0 && op.in != op.out, "{}: needs an input slot other than its output", v.where);
      const int share = share_width(v.width(op.out), c->size(), c->rank());
      MK_CHECK(v.width(op.in) == share, "{}: rank {} of {} holds {} of the {} columns, its slot has {}", v.where,
               c->rank(), c->size(), share, v.width(op.out), v.width(op.in));
    },
    .ref = all_gather_tile,
    .fast = all_gather_tile,
};

}  // namespace megakern
