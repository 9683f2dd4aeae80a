// The attention ops (parameters and what they compute: ir/op_params.h).
#pragma once

namespace megakern {

struct Op;

// Attention is tiled by (block of rows, KV head, part of its query group).
// Rows per block for a step of n_rows rows: up to 8 rows (decode batches of
// different sequences, short verify blocks) a tile is one row; a longer step
// is a prompt chunk, whose blocks of rows share each tile of keys and values.
int attention_row_block(int n_rows);
// The number of parts each group is cut into for a step of n_blocks row blocks.
int attention_group_split(const Op& op, int n_blocks, int n_workers);
// What tile t of n_tiles of an Attention op computes in a step of n_rows
// rows: rows [r0, r1), the query heads of part `part` of n_parts of KV head
// kv_head's group (query heads h0 = (kv_head * n_parts + part) * g to h0 + g,
// g = n_head / n_head_kv / n_parts).
struct AttentionTileCut {
  int r0 = 0, r1 = 0, kv_head = 0, part = 0, n_parts = 1;
};
AttentionTileCut attention_tile_cut(const Op& op, int n_rows, int t, int n_tiles);

}  // namespace megakern
