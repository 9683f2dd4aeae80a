// Per-sequence state for a model object in tests that drive executors
// directly: the single factory (ir/sequence_state.h) applied to the shape of
// the model's program.
#pragma once

#include <string>

#include "ir/sequence_state.h"
#include "model/dense_program.h"
#include "model/kimi.h"
#include "model/muse.h"
#include "model/qwen38.h"
#include "runtime/engine.h"

namespace megakern {

inline DecodeProgram program_of(const DenseModel& m) { return build_dense_program(m, 1); }
inline DecodeProgram program_of(const Qwen38Model& m) { return build_qwen38_program(m, 1); }
inline DecodeProgram program_of(const KimiModel& m) { return build_kimi_program(m, 1); }
inline DecodeProgram program_of(const MuseModel& m) { return build_muse_program(m, 1); }

// The KV cache of a sequence of n_ctx positions (ring_block, kv_type: see
// make_sequence_state).
template <class M>
KVCache make_cache(const M& m, int n_ctx, int ring_block = 0, KvType kv_type = KvType::f32) {
  return make_sequence_state(sequence_shape(program_of(m)), n_ctx, ring_block, kv_type).cache;
}

// The KV types, and a test parameter's name for each ("f16").
inline constexpr KvType kAllKvTypes[] = {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0};
struct KvTypeName {
  template <class P>
  std::string operator()(const P& info) const {
    return kv_type_name(info.param);
  }
};
// The recurrent state of a sequence.
template <class M>
RecurrentState make_state(const M& m) {
  return make_sequence_state(sequence_shape(program_of(m)), 1).state;
}

// Teacher forcing through an engine (Engine::teacher_forced_logits): the
// logits of the last n_out of toks computed at positions pos0.. of seq,
// [n_out][n_vocab] (n_out < 0: all of them).
inline std::vector<float> forced_logits(Engine& e, SequenceState& seq, const std::vector<int32_t>& toks, int pos0 = 0,
                                        int n_out = -1) {
  const int n = static_cast<int>(toks.size());
  if (n_out < 0) n_out = n;
  std::vector<float> out(static_cast<size_t>(n_out) * static_cast<size_t>(e.n_vocab()));
  e.teacher_forced_logits(seq, toks.data(), n, pos0, n_out, out.data());
  return out;
}

}  // namespace megakern
