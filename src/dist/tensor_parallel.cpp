#include "dist/tensor_parallel.h"

#include <cstring>

#include "core/error.h"

namespace megakern {

MatView TpWeights::columns(const MatView& w, int64_t c0, int64_t c1) {
  const DTypeTraits& t = dtype_traits(w.type);
  const int64_t bs = t.block_size;
  if (c0 % bs != 0 || c1 % bs != 0 || c0 < 0 || c1 > w.cols || c0 >= c1)
    fail("columns [{}, {}) of a [{}][{}] {} matrix do not lie on its blocks of {}", c0, c1, w.rows, w.cols, t.name,
         bs);
  if (w.row_bytes != static_cast<size_t>(w.cols / bs) * t.block_bytes)
    fail("a {} matrix whose rows are not a plain sequence of blocks cannot be split by columns", t.name);
  const size_t skip = static_cast<size_t>(c0 / bs) * t.block_bytes;
  const size_t rb = static_cast<size_t>((c1 - c0) / bs) * t.block_bytes;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint8_t>& buf = slices_[{w.data, c0, c1}];
  if (buf.empty()) {
    buf.resize(rb * static_cast<size_t>(w.rows));
    for (int64_t j = 0; j < w.rows; ++j) std::memcpy(buf.data() + static_cast<size_t>(j) * rb, w.row(j) + skip, rb);
  }
  MatView v = w;
  v.cols = c1 - c0;
  v.data = buf.data();
  v.row_bytes = rb;
  v.packed = nullptr;
  return v;
}

size_t TpWeights::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [key, buf] : slices_) n += buf.size();
  return n;
}

namespace {

MatView rows_of(const MatView& w, int64_t r0, int64_t r1) {
  MatView v = w;
  v.data = w.row(r0);
  v.rows = r1 - r0;
  v.packed = nullptr;
  return v;
}

template <class T>
std::span<const T> sub(std::span<const T> s, size_t b, size_t e) {
  return s.empty() ? s : s.subspan(b, e - b);
}

}  // namespace

DecodeProgram partition_tensor_parallel(const DecodeProgram& full, Communicator& comm, TpWeights& weights) {
  const int N = comm.size(), R = comm.rank();
  if (N == 1) return full;
  const std::string& model = full.model_name;
  if (full.recurrent) fail("{}: tensor parallelism does not split recurrent layers", model);

  // The head shape, the same in every layer.
  int nh = 0, nkv = 0, hd = 0, vd = 0;
  for (const Op& op : full.ops) {
    if (op.kind != OpKind::Attention) continue;
    const auto& a = op.as<ops::Attention>();
    if (nh == 0) nh = a.n_head, nkv = a.n_head_kv, hd = a.head_dim, vd = a.v_dim();
    if (a.n_head != nh || a.n_head_kv != nkv || a.head_dim != hd || a.v_dim() != vd)
      fail("{}: layer {} has another head shape than layer 0; tensor parallelism needs one", model, op.layer);
  }
  if (nh == 0) fail("{}: no attention layers to split", model);
  if (nh % N != 0 || nkv % N != 0)
    fail("--tp {}: {} has {} query heads and {} key/value heads; tensor parallelism gives each rank whole heads "
         "of both, so both must be multiples of the rank count",
         N, model, nh, nkv);
  const int nhl = nh / N, nkvl = nkv / N;

  DecodeProgram p = full;
  p.ops.clear();
  p.kv_dim = nkvl * hd;
  if (full.v_dim > 0) p.v_dim = full.v_dim / N;
  std::map<int, int> partial;  // width -> the slot the row-split products write before their reduction
  auto partial_slot = [&](int width, const char* name) {
    auto it = partial.find(width);
    if (it == partial.end()) it = partial.emplace(width, p.add_slot(name, -1, width)).first;
    return it->second;
  };
  auto set_width = [&](int slot, int width) { p.slots[static_cast<size_t>(slot)].width = width; };
  int q_slot = -1, k_slot = -1;

  for (const Op& src : full.ops) {
    Op op = src;
    const std::string where = fmt::format("op '{}' (layer {})", src.name, src.layer);
    switch (src.kind) {
      case OpKind::Embed:
      case OpKind::RmsNorm:
      case OpKind::Residual:
      case OpKind::StoreKV:
      case OpKind::LogitSoftcap:
      case OpKind::Tap:
        p.ops.push_back(op);
        break;
      case OpKind::GluAct:
        set_width(op.out, p.slots[static_cast<size_t>(op.in)].width);
        p.ops.push_back(op);
        break;
      case OpKind::HeadNormRope: {
        auto& r = op.as<ops::HeadNormRope>();
        if (op.out == q_slot && r.n_head == nh)
          r.n_head = nhl;
        else if (op.out == k_slot && r.n_head == nkv)
          r.n_head = nkvl;
        else
          fail("{}: {} rotates a slot other than attn_q's or attn_k's; cannot split it", model, where);
        p.ops.push_back(op);
        break;
      }
      case OpKind::Attention: {
        auto& a = op.as<ops::Attention>();
        a.n_head = nhl;
        a.n_head_kv = nkvl;
        a.sinks = sub(a.sinks, static_cast<size_t>(R * nhl), static_cast<size_t>((R + 1) * nhl));
        set_width(op.out, nhl * vd);
        p.ops.push_back(op);
        break;
      }
      case OpKind::MatMul: {
        auto& m = op.as<ops::MatMul>();
        const std::string& n = src.name;
        // Row splits: this rank's outputs (heads, MLP columns, vocabulary).
        auto split_rows = [&](int64_t r0, int64_t r1) {
          op.mat = rows_of(src.mat, r0, r1);
          m.bias = sub(m.bias, static_cast<size_t>(r0), static_cast<size_t>(r1));
          set_width(op.out, static_cast<int>(r1 - r0));
        };
        // Column splits: a partial sum of the full output, then the reduction.
        auto split_cols = [&](int64_t c0, int64_t c1) {
          try {
            op.mat = weights.columns(src.mat, c0, c1);
          } catch (const Error& e) {
            fail("--tp {}: {} {}: {}", N, model, where, e.what());
          }
          if (R != 0) m.bias = {};
          op.out = partial_slot(p.slots[static_cast<size_t>(src.out)].width, "tp_partial");
          p.ops.push_back(op);
          Op& red = p.add_op(OpKind::AllReduce, src.layer, src.name + "_all_reduce");
          red.in = op.out;
          red.out = src.out;
          red.as<ops::AllReduce>().comm = &comm;
        };
        if (n == "attn_q") {
          q_slot = op.out;
          split_rows(static_cast<int64_t>(R) * nhl * hd, static_cast<int64_t>(R + 1) * nhl * hd);
          p.ops.push_back(op);
        } else if (n == "attn_k" || n == "attn_v") {
          if (n == "attn_k") k_slot = op.out;
          const int w = n == "attn_k" ? hd : vd;
          split_rows(static_cast<int64_t>(R) * nkvl * w, static_cast<int64_t>(R + 1) * nkvl * w);
          p.ops.push_back(op);
        } else if (n == "ffn_gate" || n == "ffn_up") {
          if (src.mat.rows % N != 0)
            fail("--tp {}: {} has an MLP of {} columns, not a multiple of the rank count", N, model, src.mat.rows);
          split_rows(src.mat.rows / N * R, src.mat.rows / N * (R + 1));
          p.ops.push_back(op);
        } else if (n == "attn_output") {
          split_cols(static_cast<int64_t>(R) * nhl * vd, static_cast<int64_t>(R + 1) * nhl * vd);
        } else if (n == "ffn_down") {
          split_cols(src.mat.cols / N * R, src.mat.cols / N * (R + 1));
        } else if (n == "output") {
          const int V = p.slots[static_cast<size_t>(src.out)].width;
          const int v0 = share_begin(V, N, R), v1 = share_begin(V, N, R + 1);
          split_rows(v0, v1);
          set_width(src.out, V);  // the full logits, which the gather fills
          op.out = p.add_slot("logits_share", -1, v1 - v0);
          p.ops.push_back(op);
          Op& g = p.add_op(OpKind::AllGather, src.layer, "output_all_gather");
          g.in = op.out;
          g.out = src.out;
          g.as<ops::AllGather>().comm = &comm;
        } else {
          fail("--tp {}: {} {}: tensor parallelism does not know how to split this matrix product", N, model, where);
        }
        break;
      }
      default:
        fail("--tp {}: {} {}: tensor parallelism does not split {} ops (it splits dense transformers)", N, model,
             where, op_kind_name(src.kind));
    }
  }
  p.verify();
  return p;
}

}  // namespace megakern
