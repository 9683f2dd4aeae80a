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

}  // namespace megakern
