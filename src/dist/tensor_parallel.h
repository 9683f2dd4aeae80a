// Tensor parallelism: one rank's part of a dense transformer's decode
// program (the program model/dense_program.cpp builds for the llama, qwen2,
// qwen3, gemma and SmolLM2 families and the dense presets), for a group of N
// ranks (ir/collective.h).
//
// The layout (rank p of N; shares contiguous, in rank order):
//  - attention: rank p holds query heads [p nh/N, (p+1) nh/N) and key/value
//    heads [p nkv/N, (p+1) nkv/N): the rows of attn_q / attn_k / attn_v (and
//    their biases), its heads' KV cache (kv_dim / N per position), and the
//    matching columns of attn_output, whose partial sums an AllReduce adds;
//  - MLP: rows [p F/N, (p+1) F/N) of ffn_gate and ffn_up, the same columns
//    of ffn_down, then an AllReduce;
//  - output head: vocabulary rows [share_begin(V, N, p), share_begin(V, N, p+1)),
//    then an AllGather of the logits (every rank has them all);
//  - the embedding, the norms and the residual stream: replicated.
// A bias of a column-split projection is added by rank 0 only. The
// AllReduce sums the ranks' partials in rank order, so the logits are those
// of any single-process run of the same partition with the same order
// (dist/local_comm.h), bit for bit.
//
// Requires nh and nkv divisible by N (each rank keeps whole GQA groups) and
// F divisible by N, with every column share of attn_output and ffn_down on a
// block boundary of its weight format. Refuses other programs (MoE, MLA,
// recurrent layers) with a message naming the op.
#pragma once

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "ir/collective.h"
#include "ir/program.h"

namespace megakern {

// The column slices of weight matrices a rank keeps (row slices are views
// into the model's weights): shared by every program partitioned with it,
// which must not outlive it.
class TpWeights {
 public:
  // Columns [c0, c1) of every row of w, as a contiguous matrix of w's format.
  MatView columns(const MatView& w, int64_t c0, int64_t c1);
  size_t bytes() const;

 private:
  mutable std::mutex mu_;
  std::map<std::tuple<const uint8_t*, int64_t, int64_t>, std::vector<uint8_t>> slices_;
};

// Rank comm.rank()'s part of `full` (returned unchanged when comm.size() is
// 1). Throws megakern::Error naming what cannot be split.
DecodeProgram partition_tensor_parallel(const DecodeProgram& full, Communicator& comm, TpWeights& weights);

}  // namespace megakern
