// A race checker for compiled schedules that trusts none of the metadata
// compile() orders tiles by (OpInfo::tile_rows, reads_tile, row_tiled,
// feeds_all_rows, reads_out).
//
// For every tile it derives what the tile's kernel reads and writes from the
// op's kind and operands: the rows and columns of each slot (a matrix
// product's tile its output columns for every row, an attention tile its row
// block and query heads and its KV head's columns of the cache rows, an
// expert tile its output range of the selections that resolve to its expert
// slot, a recurrent tile the rows of the block its row starts, ...), the KV
// cache rows StoreKV writes, the recurrent state and the tap buffer. Then,
// cell by cell (a slot's row cut at every column boundary any access uses),
// it replays the program in order and requires each tile to wait, directly
// or through other tiles' dependencies, for the last writers of every cell
// it touches and, when it writes, for the readers since; and two tiles of one
// op may touch the same cell, one of them writing, only when one waits for
// the other (chained recurrent rows). Accesses that depend on the step's
// routing or sequences are taken at their widest, keyed by what keeps them
// apart: two expert slots of one route never meet (each selection resolves
// to one expert), nor do the recurrent blocks of two rows.
//
// Shapes only: it reads op shapes and parameters, never weights, so it runs
// on programs built from a preset's shapes (`inspect --race-check`).
#pragma once

#include <cstdint>

#include "exec/schedule.h"

namespace megakern {

struct RaceCheckStats {
  int64_t tiles = 0;
  int64_t accesses = 0;       // derived reads and writes (one per slot, cache or state a tile touches)
  int64_t cells = 0;          // (resource, row, column atom) cells visited, summed over accesses
  int64_t orderings = 0;      // tile pairs required to be ordered (distinct per consumer tile)
  int64_t transitive = 0;     // of which ordered through other tiles, not a direct dependency
  int64_t same_op_pairs = 0;  // pairs of tiles of one op found touching a common cell, one writing
};

// Checks s (compiled from p) as described above; throws std::logic_error
// naming the two tiles, the slot (or cache / state) and the rows and columns
// where they meet when a pair of tiles that touch a common value, one of
// them writing it, is not ordered by the schedule's dependencies, or when the
// schedule's tile lists do not hold every tile once.
RaceCheckStats race_check(const DecodeProgram& p, const Schedule& s);

}  // namespace megakern
