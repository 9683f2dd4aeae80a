// Builds the DecodeProgram of a dense model (llama / qwen3 / gemma3).
#pragma once

#include "ir/program.h"
#include "model/dense.h"

namespace megakern {

// The program references the model's weights; the model must outlive it.
DecodeProgram build_dense_program(const DenseModel& model, int max_rows);

}  // namespace megakern
