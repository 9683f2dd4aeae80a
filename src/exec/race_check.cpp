#include "exec/race_check.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <stdexcept>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "ir/expert_bank.h"
#include "ops/attention.h"
#include "ops/matmul.h"
#include "ops/moe.h"

namespace megakern {

namespace {

// Tags keep apart accesses that are taken at their widest but never meet:
// kSeq, tag r: the rows of the recurrent block row r starts (a step's rows
// fall into blocks, each done by its first row's tiles; blocks of different
// rows are disjoint, whichever way the rows form them). An expert op's
// domain (its route slot and top_k), tag s: the selections that resolve to
// its expert slot s (each selection resolves to one slot).
constexpr int kUntagged = -1, kSeq = 0;

// One read or write of a tile: rows [r0, r1) of a resource, columns
// [c0 + i * stride, c1 + i * stride) for i < reps.
struct Access {
  int res = 0;
  int r0 = 0, r1 = 0, c0 = 0, c1 = 0, reps = 1, stride = 0;
  bool write = false;
  int dom = kUntagged, tag = 0;
};

struct Resource {
  std::string name;
  int rows = 0, cols = 0;
};

// Resources: the slots, then per cache layer the KV cache's keys and values
// (a row: the position that step row stores) and per recurrent layer the
// conv windows and delta-rule states (one row per sequence, tagged by its
// block, or one per step row when rows chain their states; delta-rule
// states one column per value head), then the tap buffer.
class Derive {
 public:
  Derive(const DecodeProgram& p, int n_rows, bool chained) : p_(p), R_(n_rows), chained_(chained) {
    for (const Op& op : p.ops) n_layers_ = std::max(n_layers_, op.cache_layer() + 1);
    const int S = static_cast<int>(p.slots.size());
    for (int s = 0; s < S; ++s)
      res_.push_back({fmt::format("slot {} '{}' (layer {})", s, p.slots[static_cast<size_t>(s)].name,
                                  p.slots[static_cast<size_t>(s)].layer),
                      R_, p.slots[static_cast<size_t>(s)].width});
    const int state_rows = chained_ ? R_ : 1;
    for (int l = 0; l < n_layers_; ++l) {
      res_.push_back({fmt::format("KV cache layer {} keys", l), R_, p.kv_dim});
      res_.push_back({fmt::format("KV cache layer {} values", l), R_, p.v_width()});
      res_.push_back({fmt::format("recurrent state layer {} conv window", l), state_rows, 1});
      int heads = 1;
      for (const Op& op : p.ops)
        if (op.kind == OpKind::DeltaRule && op.cache_layer() == l) heads = std::max(heads, op.as<ops::DeltaRule>().n_head);
      res_.push_back({fmt::format("recurrent state layer {} delta-rule state (column: value head)", l), state_rows, heads});
    }
    res_.push_back({"tap buffer", R_, p.tap_width});
  }
  const std::vector<Resource>& resources() const { return res_; }

  // What tile t of n of op runs on, from its kind's kernel.
  void tile(const Op& op, int t, int n, std::vector<Access>& out) const {
    out_ = &out;
    const int R = R_;
    auto w = [&](int slot) { return p_.slots[static_cast<size_t>(slot)].width; };
    auto row = [&](int r) {
      if (r < 0 || r >= R)
        throw std::logic_error(fmt::format("race check: op '{}' (layer {}) has tile {} of {}, a per-row kind with {} rows",
                                           op.name, op.layer, t, n, R));
      return r;
    };
    switch (op.kind) {
      case OpKind::Embed:
        slot(op.out, row(t), t + 1, true);
        break;
      case OpKind::RmsNorm:
      case OpKind::GluAct:
      case OpKind::MoeRoute:
      case OpKind::MlaKey:
      case OpKind::MoeCombine:
        slot(op.in, row(t), t + 1, false);
        slot(op.in2, t, t + 1, false);
        slot(op.out, t, t + 1, true);
        break;
      case OpKind::HeadNormRope:
      case OpKind::LogitSoftcap:
        slot(op.out, row(t), t + 1, false);
        slot(op.out, t, t + 1, true);
        break;
      case OpKind::Residual:
      case OpKind::SigmoidGate:
      case OpKind::GatedRmsNorm:
      case OpKind::GatedResidual:
      case OpKind::HeadNormGate:
        slot(op.in, row(t), t + 1, false);
        slot(op.out, t, t + 1, false);
        slot(op.out, t, t + 1, true);
        break;
      case OpKind::StoreKV:
        slot(op.in, row(t), t + 1, false);
        slot(op.in2, t, t + 1, false);
        add({kv(op, 0), t, t + 1, 0, p_.kv_dim, 1, 0, true});
        add({kv(op, 1), t, t + 1, 0, p_.v_width(), 1, 0, true});
        slot(op.out, t, t + 1, true);  // the width-0 cache marker: nothing
        break;
      case OpKind::Attention: {
        const auto& a = op.as<ops::Attention>();
        const AttentionTileCut c = attention_tile_cut(op, R, t, n);
        const int group = a.n_head / a.n_head_kv / c.n_parts, h0 = (c.kv_head * c.n_parts + c.part) * group;
        const int hd = a.head_dim, vd = a.v_dim();
        add({op.in, c.r0, c.r1, h0 * hd, (h0 + group) * hd, 1, 0, false});
        // Every row of the step may be of this block's sequence: its keys and values, of this KV head.
        add({kv(op, 0), 0, R, c.kv_head * hd, (c.kv_head + 1) * hd, 1, 0, false});
        add({kv(op, 1), 0, R, c.kv_head * vd, (c.kv_head + 1) * vd, 1, 0, false});
        add({op.out, c.r0, c.r1, h0 * vd, (h0 + group) * vd, 1, 0, true});
        break;
      }
      case OpKind::MatMul: {
        int64_t b = 0, e = 0;
        matmul_tile_range(op, t, n, b, e);
        slot(op.in, 0, R, false);
        add({op.out, 0, R, static_cast<int>(b), static_cast<int>(e), 1, 0, true});
        break;
      }
      case OpKind::CausalConvSilu: {
        const int st = state(op, 2);
        if (chained_) {
          slot(op.out, row(t), t + 1, false);
          slot(op.out, t, t + 1, true);
          if (t > 0) add({st, t - 1, t, 0, 1, 1, 0, false});
          add({st, t, t + 1, 0, 1, 1, 0, true});
        } else {
          // The block row t starts: rows t.. of one sequence, in place, and its window.
          for (bool wr : {false, true}) {
            add({op.out, row(t), R, 0, w(op.out), 1, 0, wr, kSeq, t});
            add({st, 0, 1, 0, 1, 1, 0, wr, kSeq, t});
          }
        }
        break;
      }
      case OpKind::DeltaRule: {
        const auto& a = op.as<ops::DeltaRule>();
        const int r = row(t / a.n_head), h = t % a.n_head, st = state(op, 3);
        const int dom = chained_ ? kUntagged : kSeq, r1 = chained_ ? r + 1 : R;
        for (int in : {op.in, op.in2, op.in3})
          if (in >= 0 && w(in) > 0) add({in, r, r1, 0, w(in), 1, 0, false, dom, r});
        add({op.out, r, r1, h * a.head_dim, (h + 1) * a.head_dim, 1, 0, true, dom, r});
        if (chained_) {
          if (r > 0) add({st, r - 1, r, h, h + 1, 1, 0, false});
          add({st, r, r + 1, h, h + 1, 1, 0, true});
        } else {
          add({st, 0, 1, h, h + 1, 1, 0, false, kSeq, r});
          add({st, 0, 1, h, h + 1, 1, 0, true, kSeq, r});
        }
        break;
      }
      case OpKind::MoeGlu:
      case OpKind::MoeDown: {
        // Selection j of every row that chose this slot's expert: the route
        // (ids), the input (MoeGlu: the row; MoeDown: the row's hidden
        // values of selection j), the output range of selection j.
        const ops::MoeExperts& x = op.kind == OpKind::MoeGlu ? static_cast<const ops::MoeExperts&>(op.as<ops::MoeGlu>())
                                                              : op.as<ops::MoeDown>();
        const MoeTileCut c = moe_tile_cut(op, R, t, n);
        const int dom = 1 + op.in2 * 1024 + x.top_k, k = x.top_k;
        const int F = x.bank->d_ff, D = x.bank->d_in;
        add({op.in2, 0, R, 0, k, 1, 0, false});
        if (op.kind == OpKind::MoeGlu) {
          add({op.in, 0, R, 0, w(op.in), 1, 0, false, dom, c.slot});
          add({op.out, 0, R, c.begin, c.end, k, F, true, dom, c.slot});
        } else {
          add({op.in, 0, R, 0, F, k, F, false, dom, c.slot});
          add({op.out, 0, R, c.begin, c.end, k, D, true, dom, c.slot});
        }
        break;
      }
      case OpKind::AttnResMix: {
        const int H = w(op.out);
        add({op.in, row(t), t + 1, 0, op.as<ops::AttnResMix>().n_blocks * H, 1, 0, false});
        slot(op.out, t, t + 1, true);
        break;
      }
      case OpKind::AttnResAdd: {
        const auto& a = op.as<ops::AttnResAdd>();
        const int H = w(op.in);
        slot(op.in, row(t), t + 1, false);
        if (!a.overwrite) add({op.out, t, t + 1, a.block * H, (a.block + 1) * H, 1, 0, false});
        add({op.out, t, t + 1, a.block * H, (a.block + 1) * H, 1, 0, true});
        break;
      }
      case OpKind::AllReduce:
      case OpKind::AllGather:
        if (n != 1) throw std::logic_error(fmt::format("race check: collective '{}' cut into {} tiles", op.name, n));
        slot(op.in, 0, R, false);
        slot(op.out, 0, R, true);
        break;
      case OpKind::Tap: {
        const auto& a = op.as<ops::Tap>();
        const int width = a.width > 0 ? a.width : w(op.in);
        add({op.in, row(t), t + 1, a.src, a.src + width, 1, 0, false});
        if (p_.tap_width > 0) add({tap_res(), t, t + 1, a.offset, a.offset + width, 1, 0, true});
        break;
      }
    }
  }

 private:
  void add(const Access& a) const {
    if (res_[static_cast<size_t>(a.res)].cols > 0 && a.c1 > a.c0 && a.r1 > a.r0) out_->push_back(a);
  }
  void slot(int s, int r0, int r1, bool write) const {
    if (s >= 0) add({s, r0, r1, 0, p_.slots[static_cast<size_t>(s)].width, 1, 0, write});
  }
  int layer_res(const Op& op, int k) const { return static_cast<int>(p_.slots.size()) + 4 * op.cache_layer() + k; }
  int kv(const Op& op, int k) const { return layer_res(op, k); }
  int state(const Op& op, int k) const { return layer_res(op, k); }
  int tap_res() const { return static_cast<int>(res_.size()) - 1; }

  const DecodeProgram& p_;
  int R_;
  bool chained_;
  int n_layers_ = 0;
  std::vector<Resource> res_;
  mutable std::vector<Access>* out_ = nullptr;
};

struct Ev {
  int flag = 0, dom = kUntagged, tag = 0;
  bool operator<(const Ev& o) const { return std::tie(dom, tag, flag) < std::tie(o.dom, o.tag, o.flag); }
};

// A cell's last writers and its readers since (each sorted), and what the
// op being replayed does to it.
struct Cell {
  std::vector<Ev> w, r, nw, nr;
};

// Calls f on each entry of v (sorted) that may meet an access tagged (dom, tag).
template <class F>
void each_meeting(const std::vector<Ev>& v, int dom, int tag, F&& f) {
  if (dom == kUntagged) {
    for (const Ev& e : v) f(e);
    return;
  }
  const auto lo = std::lower_bound(v.begin(), v.end(), Ev{INT_MIN, dom, INT_MIN});
  const auto hi = std::upper_bound(v.begin(), v.end(), Ev{INT_MAX, dom, INT_MAX});
  for (auto it = v.begin(); it != lo; ++it) f(*it);
  const auto a = std::lower_bound(lo, hi, Ev{INT_MIN, dom, tag}), b = std::upper_bound(lo, hi, Ev{INT_MAX, dom, tag});
  for (auto it = a; it != b; ++it) f(*it);
  for (auto it = hi; it != v.end(); ++it) f(*it);
}

class Checker {
 public:
  Checker(const DecodeProgram& p, const Schedule& s) : p_(p), s_(s), d_(p, s.n_rows, s.chained) {}

  RaceCheckStats run() {
    index_tasks();
    const auto& res = d_.resources();
    // Every access of every tile, and the column boundaries of each resource.
    acc_begin_.assign(static_cast<size_t>(s_.n_flags) + 1, 0);
    std::vector<std::vector<int>> cuts(res.size());
    std::vector<int> last_op(res.size(), -1);
    for (int f = 0; f < s_.n_flags; ++f) {
      const Task& t = *task_[static_cast<size_t>(f)];
      d_.tile(p_.ops[static_cast<size_t>(t.op)], t.tile, t.n_tiles, acc_);
      acc_begin_[static_cast<size_t>(f) + 1] = acc_.size();
    }
    for (size_t i = 0; i < acc_.size(); ++i) {
      const Access& a = acc_[i];
      const Resource& rs = res[static_cast<size_t>(a.res)];
      if (a.r0 < 0 || a.r1 > rs.rows || a.c0 < 0 || a.c1 + (a.reps - 1) * a.stride > rs.cols)
        fail_access(i, fmt::format("reaches outside {} ({} rows, {} columns)", rs.name, rs.rows, rs.cols));
      auto& c = cuts[static_cast<size_t>(a.res)];
      for (int k = 0; k < a.reps; ++k) {
        c.push_back(a.c0 + k * a.stride);
        c.push_back(a.c1 + k * a.stride);
      }
      last_op[static_cast<size_t>(a.res)] = std::max(last_op[static_cast<size_t>(a.res)], flag_op_[static_cast<size_t>(flag_of(i))]);
    }
    for (auto& c : cuts) {
      std::sort(c.begin(), c.end());
      c.erase(std::unique(c.begin(), c.end()), c.end());
    }
    std::vector<std::vector<Cell>> cells(res.size());
    std::vector<std::vector<int>> frees(p_.ops.size());
    for (size_t k = 0; k < res.size(); ++k)
      if (last_op[k] >= 0) frees[static_cast<size_t>(last_op[k])].push_back(static_cast<int>(k));
    stats_.tiles = s_.n_flags;
    stats_.accesses = static_cast<int64_t>(acc_.size());
    window_init();
    seen_.assign(static_cast<size_t>(s_.n_flags), 0);
    need_mark_.assign(static_cast<size_t>(s_.n_flags), 0);
    dep_mark_.assign(static_cast<size_t>(s_.n_flags), 0);
    struct Need {
      int pred;
      size_t acc;
      int row, col0, col1;
      bool pred_wrote;
      const Cell* cell;
      int dom, tag;
    };
    std::vector<Need> need;
    std::vector<Cell*> touched;
    for (size_t j = 0; j < p_.ops.size(); ++j) {
      touched.clear();
      for (int f = s_.op_flag[j]; f < s_.op_flag[j] + s_.op_tiles[j]; ++f) {
        need.clear();
        window_add(f);
        for (size_t i = acc_begin_[static_cast<size_t>(f)]; i < acc_begin_[static_cast<size_t>(f) + 1]; ++i) {
          const Access& a = acc_[i];
          const auto& cut = cuts[static_cast<size_t>(a.res)];
          const int n_atoms = static_cast<int>(cut.size()) - 1;
          auto& cv = cells[static_cast<size_t>(a.res)];
          if (cv.empty()) cv.resize(static_cast<size_t>(res[static_cast<size_t>(a.res)].rows) * static_cast<size_t>(n_atoms));
          const Ev me{f, a.dom, a.tag};
          for (int k = 0; k < a.reps; ++k) {
            const int b = static_cast<int>(std::lower_bound(cut.begin(), cut.end(), a.c0 + k * a.stride) - cut.begin());
            const int e = static_cast<int>(std::lower_bound(cut.begin(), cut.end(), a.c1 + k * a.stride) - cut.begin());
            for (int r = a.r0; r < a.r1; ++r)
              for (int at = b; at < e; ++at) {
                Cell& c = cv[static_cast<size_t>(r) * static_cast<size_t>(n_atoms) + static_cast<size_t>(at)];
                ++stats_.cells;
                if (c.nw.empty() && c.nr.empty()) touched.push_back(&c);
                (a.write ? c.nw : c.nr).push_back(me);
                auto want = [&](bool wrote) {
                  return [&, wrote](const Ev& e) {
                    // One entry per earlier tile: the first cell where they meet.
                    if (need_mark_[static_cast<size_t>(e.flag)] == f + 1) return;
                    need_mark_[static_cast<size_t>(e.flag)] = f + 1;
                    need.push_back({e.flag, i, r, cut[static_cast<size_t>(at)], cut[static_cast<size_t>(at) + 1], wrote,
                                    &c, e.dom, e.tag});
                  };
                };
                each_meeting(c.w, a.dom, a.tag, want(true));
                if (a.write) each_meeting(c.r, a.dom, a.tag, want(false));
              }
          }
        }
        check_ordered(f, need);
      }
      // Tiles of this op against each other, then the cells' new history.
      const Op& op = p_.ops[j];
      int all_tags = 0;  // expert slots of an expert op
      if (op.kind == OpKind::MoeGlu || op.kind == OpKind::MoeDown) {
        const ops::MoeExperts& x = op.kind == OpKind::MoeGlu ? static_cast<const ops::MoeExperts&>(op.as<ops::MoeGlu>())
                                                              : op.as<ops::MoeDown>();
        all_tags = std::min(x.bank->n_expert, s_.n_rows * x.top_k);
      }
      for (Cell* c : touched) {
        std::sort(c->nw.begin(), c->nw.end());
        std::sort(c->nr.begin(), c->nr.end());
        for (const Ev& x : c->nw) {
          auto pair = [&](const Ev& y) {
            if (y.flag == x.flag) return;
            ++stats_.same_op_pairs;
            const int lo = std::min(x.flag, y.flag), hi = std::max(x.flag, y.flag);
            if (!ancestor(lo, hi)) race_same_op(lo, hi, *c, cells, cuts);
          };
          each_meeting(c->nw, x.dom, x.tag, [&](const Ev& y) { if (y.flag > x.flag) pair(y); });
          each_meeting(c->nr, x.dom, x.tag, pair);
        }
        if (!c->nw.empty()) {
          // Untagged writes replace the cell's history, and so do an expert
          // op's writes of every expert slot (every selection resolves to one).
          const bool all_untagged = std::all_of(c->nw.begin(), c->nw.end(), [](const Ev& e) { return e.dom == kUntagged; });
          bool every_tag = false;
          if (all_tags > 0 && !all_untagged && c->nw.front().dom == c->nw.back().dom) {
            int distinct = 0;
            for (size_t k = 0; k < c->nw.size(); ++k) distinct += k == 0 || c->nw[k].tag != c->nw[k - 1].tag;
            every_tag = distinct == all_tags;
          }
          if (all_untagged || every_tag) {
            c->w.swap(c->nw);
            c->r.clear();
          } else {
            // A tagged write supersedes the entries of its own tag (each was
            // checked to come before it; whatever meets them meets it).
            auto superseded = [&](const Ev& e) {
              if (e.dom == kUntagged) return false;
              const auto it = std::lower_bound(c->nw.begin(), c->nw.end(), Ev{INT_MIN, e.dom, e.tag});
              return it != c->nw.end() && it->dom == e.dom && it->tag == e.tag;
            };
            std::erase_if(c->w, superseded);
            std::erase_if(c->r, superseded);
            c->w.insert(c->w.end(), c->nw.begin(), c->nw.end());
            std::sort(c->w.begin(), c->w.end());
            c->r.insert(c->r.end(), c->nr.begin(), c->nr.end());
            std::sort(c->r.begin(), c->r.end());
          }
        } else {
          c->r.insert(c->r.end(), c->nr.begin(), c->nr.end());
          std::sort(c->r.begin(), c->r.end());
        }
        c->nw.clear();
        c->nr.clear();
      }
      for (int k : frees[j]) std::vector<Cell>().swap(cells[static_cast<size_t>(k)]);
    }
    return stats_;
  }

 private:
  void index_tasks() {
    const size_t n_ops = p_.ops.size();
    if (s_.op_tiles.size() != n_ops || s_.op_flag.size() != n_ops)
      throw std::logic_error("race check: the schedule's op tables do not match the program");
    flag_op_.assign(static_cast<size_t>(s_.n_flags), -1);
    for (size_t i = 0; i < n_ops; ++i)
      for (int t = 0; t < s_.op_tiles[i]; ++t) {
        const int f = s_.op_flag[i] + t;
        if (f < 0 || f >= s_.n_flags || flag_op_[static_cast<size_t>(f)] >= 0)
          throw std::logic_error(fmt::format("race check: op {} tile {} has flag {}, taken or out of range", i, t, f));
        flag_op_[static_cast<size_t>(f)] = static_cast<int>(i);
      }
    task_.assign(static_cast<size_t>(s_.n_flags), nullptr);
    for (const auto& list : s_.worker_tasks)
      for (const Task& t : list) {
        if (t.flag < 0 || t.flag >= s_.n_flags || flag_op_[static_cast<size_t>(t.flag)] != t.op ||
            t.flag - s_.op_flag[static_cast<size_t>(t.op)] != t.tile || t.n_tiles != s_.op_tiles[static_cast<size_t>(t.op)])
          throw std::logic_error(fmt::format("race check: a task (op {}, tile {}) has flag {}", t.op, t.tile, t.flag));
        if (task_[static_cast<size_t>(t.flag)])
          throw std::logic_error(fmt::format("race check: {} is on two worker lists", tile_name(t.flag)));
        task_[static_cast<size_t>(t.flag)] = &t;
        for (uint32_t d = t.dep_begin; d < t.dep_end; ++d)
          if (s_.deps[d] < 0 || s_.deps[d] >= t.flag)
            throw std::logic_error(fmt::format("race check: {} waits for flag {}, not an earlier tile", tile_name(t.flag), s_.deps[d]));
        check_chunks(t);
      }
    for (int f = 0; f < s_.n_flags; ++f)
      if (!task_[static_cast<size_t>(f)])
        throw std::logic_error(fmt::format("race check: {} is on no worker's list", tile_name(f)));
  }

  // Chunks of one tile run at once on different workers: a matrix product's
  // chunk ranges must lie inside the tile's and not overlap.
  void check_chunks(const Task& t) const {
    if (t.chunks == 1) return;
    const Op& op = p_.ops[static_cast<size_t>(t.op)];
    if (op.kind != OpKind::MatMul || t.chunks < 1)
      throw std::logic_error(fmt::format("race check: {} is cut into {} chunks; only matrix products' tiles can be",
                                         tile_name(t.flag), t.chunks));
    int64_t b = 0, e = 0, prev = 0;
    matmul_tile_range(op, t.tile, t.n_tiles, b, e);
    prev = b;
    for (int c = 0; c < t.chunks; ++c) {
      int64_t cb = 0, ce = 0;
      matmul_tile_range(op, t.tile * t.chunks + c, t.n_tiles * t.chunks, cb, ce);
      if (cb < prev || ce > e || ce < cb)
        throw std::logic_error(fmt::format("race check: {} chunk {} of {} computes columns [{}, {}), outside the tile's "
                                           "[{}, {}) or over the previous chunk's",
                                           tile_name(t.flag), c, t.chunks, cb, ce, b, e));
      prev = ce;
    }
  }

  std::string tile_name(int f) const {
    const int i = flag_op_[static_cast<size_t>(f)];
    const Op& op = p_.ops[static_cast<size_t>(i)];
    return fmt::format("op {} ({} '{}' layer {}) tile {}", i, op_kind_name(op.kind), op.name, op.layer,
                       f - s_.op_flag[static_cast<size_t>(i)]);
  }
  int flag_of(size_t acc) const {
    return static_cast<int>(std::upper_bound(acc_begin_.begin(), acc_begin_.end(), acc) - acc_begin_.begin()) - 1;
  }
  [[noreturn]] void fail_access(size_t i, const std::string& what) const {
    throw std::logic_error(fmt::format("race check of {} ({} rows, {} workers): {} {}", p_.model_name, s_.n_rows,
                                       s_.n_workers, tile_name(flag_of(i)), what));
  }

  // Ancestors of the recent tiles, as bitsets over the kWindow flags before
  // each (bit i of tile b: flag b - 1 - i), in a ring; computed in flag order
  // from the dependencies (older ones lie outside the window).
  void window_init() {
    window_ = 8192;
    for (int n : s_.op_tiles) window_ = std::max(window_, 2 * n);
    window_ = (window_ + 63) / 64 * 64;
    words_ = window_ / 64;
    ring_.assign(static_cast<size_t>(window_) * static_cast<size_t>(words_), 0);
    prefix_.assign(static_cast<size_t>(s_.n_flags), 0);
  }
  uint64_t* bits(int f) { return ring_.data() + static_cast<size_t>(f % window_) * static_cast<size_t>(words_); }
  void window_add(int b) {
    uint64_t* a = bits(b);
    std::fill(a, a + words_, 0);
    const Task& t = *task_[static_cast<size_t>(b)];
    for (uint32_t k = t.dep_begin; k < t.dep_end; ++k) {
      const int d = s_.deps[k], delta = b - d;
      if (delta > window_) continue;
      a[(delta - 1) / 64] |= uint64_t{1} << ((delta - 1) % 64);
      const uint64_t* src = bits(d);
      const int q = delta / 64, sh = delta % 64;
      for (int i = words_ - 1; i >= q; --i) {
        uint64_t v = src[i - q] << sh;
        if (sh && i - q - 1 >= 0) v |= src[i - q - 1] >> (64 - sh);
        a[i] |= v;
      }
    }
    // The prefix of earlier tiles all done before b: what its dependencies'
    // prefixes hold, extended over the window's run of ancestors above it.
    int pre = 0;
    for (uint32_t k = t.dep_begin; k < t.dep_end; ++k) pre = std::max(pre, prefix_[static_cast<size_t>(s_.deps[k])]);
    while (pre < b && b - pre <= window_) {
      const int i = b - 1 - pre, bit = i % 64;
      const int ones = std::countl_one(a[i / 64] << (63 - bit));
      pre += std::min(ones, bit + 1);
      if (ones <= bit) break;
    }
    prefix_[static_cast<size_t>(b)] = pre;
  }
  // Whether tile a is done before tile b starts (a < b): b waits for it,
  // directly or through the tiles it waits for. b's bitset must be in the ring.
  bool ancestor(int a, int b) {
    if (a < prefix_[static_cast<size_t>(b)]) return true;
    if (b - a <= window_) {
      const int i = b - 1 - a;
      return (bits(b)[i / 64] >> (i % 64)) & 1;
    }
    return search(a, b);
  }
  // Depth first from b, never below a's flag (for pairs further apart than
  // the window).
  bool search(int a, int b) {
    ++stamp_;
    stack_.clear();
    stack_.push_back(b);
    while (!stack_.empty()) {
      const int f = stack_.back();
      stack_.pop_back();
      const Task& t = *task_[static_cast<size_t>(f)];
      for (uint32_t k = t.dep_begin; k < t.dep_end; ++k) {
        const int d = s_.deps[k];
        if (d == a || a < prefix_[static_cast<size_t>(d)]) return true;
        if (d < a || seen_[static_cast<size_t>(d)] == stamp_) continue;
        seen_[static_cast<size_t>(d)] = stamp_;
        stack_.push_back(d);
      }
    }
    return false;
  }

  template <class Need>
  void check_ordered(int f, std::vector<Need>& need) {
    if (need.empty()) return;
    // need holds each earlier tile once; the first race reported is the
    // one with the earliest tile.
    std::sort(need.begin(), need.end(), [](const Need& x, const Need& y) { return x.pred < y.pred; });
    const Task& t = *task_[static_cast<size_t>(f)];
    for (uint32_t d = t.dep_begin; d < t.dep_end; ++d) dep_mark_[static_cast<size_t>(s_.deps[d])] = f + 1;
    for (size_t k = 0; k < need.size(); ++k) {
      const Need& n = need[k];
      ++stats_.orderings;
      if (dep_mark_[static_cast<size_t>(n.pred)] == f + 1) continue;  // a direct dependency
      ++stats_.transitive;
      if (n.pred < prefix_[static_cast<size_t>(f)] ||
          (f - n.pred <= window_ ? ancestor(n.pred, f) : witnessed(n, f) || search(n.pred, f)))
        continue;
      const Access& a = acc_[n.acc];
      const Resource& rs = d_.resources()[static_cast<size_t>(a.res)];
      throw std::logic_error(fmt::format(
          "race in the schedule of {} ({} rows, {} workers): {} {} {} row {} columns [{}, {}), which {} {}, and does not "
          "wait for it",
          p_.model_name, s_.n_rows, s_.n_workers, tile_name(f), a.write ? "writes" : "reads", rs.name, n.row, n.col0,
          n.col1, tile_name(n.pred), n.pred_wrote ? "wrote" : "read"));
    }
  }
  // A writer further back than the window: tile f is after it when it is
  // after a later reader of the cell that was itself checked to be after
  // it (a reader whose tag meets the writer's), within the window.
  template <class Need>
  bool witnessed(const Need& n, int f) {
    if (!n.pred_wrote) return false;
    for (auto it = n.cell->r.rbegin(); it != n.cell->r.rend(); ++it) {
      const Ev& y = *it;
      const bool meets = y.dom == kUntagged || n.dom == kUntagged || y.dom != n.dom || y.tag == n.tag;
      if (y.flag > n.pred && meets && f - y.flag <= window_ && ancestor(y.flag, f)) return true;
    }
    return false;
  }

  [[noreturn]] void race_same_op(int a, int b, const Cell& c, const std::vector<std::vector<Cell>>& cells,
                                 const std::vector<std::vector<int>>& cuts) const {
    // Where the cell is, for the message.
    std::string where = "a common cell";
    for (size_t k = 0; k < cells.size(); ++k) {
      if (cells[k].empty()) continue;
      const Cell* base = cells[k].data();
      if (&c >= base && &c < base + cells[k].size()) {
        const size_t n_atoms = cuts[k].size() - 1, idx = static_cast<size_t>(&c - base);
        where = fmt::format("{} row {} columns [{}, {})", d_.resources()[k].name, idx / n_atoms, cuts[k][idx % n_atoms],
                            cuts[k][idx % n_atoms + 1]);
      }
    }
    throw std::logic_error(fmt::format("race in the schedule of {} ({} rows, {} workers): {} and {} both touch {}, one "
                                       "writing, and neither waits for the other",
                                       p_.model_name, s_.n_rows, s_.n_workers, tile_name(a), tile_name(b), where));
  }

  const DecodeProgram& p_;
  const Schedule& s_;
  Derive d_;
  RaceCheckStats stats_;
  std::vector<int> flag_op_;
  std::vector<const Task*> task_;
  int window_ = 0, words_ = 0;
  std::vector<uint64_t> ring_;
  std::vector<int> prefix_;  // per tile: every tile below this flag is done before it starts
  std::vector<Access> acc_;
  std::vector<size_t> acc_begin_;
  std::vector<uint32_t> seen_;
  std::vector<int> need_mark_, dep_mark_;  // f + 1 at the earlier tiles tile f meets / waits for directly
  uint32_t stamp_ = 0;

  std::vector<int> stack_;
};

}  // namespace

RaceCheckStats race_check(const DecodeProgram& p, const Schedule& s) { return Checker(p, s).run(); }

}  // namespace megakern
