// Builds the DecodeProgram of a dense model (the families of model/dense_families.h).
#pragma once

#include "ir/program.h"
#include "model/dense.h"

namespace megakern {

// The most rows a dense program can be built for.
inline constexpr int kDenseMaxRows = 512;

// The program references the model's weights; the model must outlive it.
// Throws unless 1 <= max_rows <= kDenseMaxRows.
DecodeProgram build_dense_program(const DenseModel& model, int max_rows);

}  // namespace megakern
