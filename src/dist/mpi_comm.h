// The MPI world as a Communicator (ir/collective.h): every process started by
// `mpirun -np N` is one rank of one tensor-parallel group. Built when CMake
// finds MPI (MEGAKERN_HAVE_MPI); otherwise mpi_world() refuses with a message.
#pragma once

#include <memory>

#include "ir/collective.h"

namespace megakern {

// Whether this build has MPI.
bool mpi_available();

// Initialises MPI on first use (threads: one at a time may call it, the
// collective ops run on whichever worker claims their tile) and finalises it
// at exit. The communicator lives until exit. Throws megakern::Error when
// built without MPI.
Communicator& mpi_world();

// Ends every rank of the job with `code` (MPI_Abort) when MPI is running and
// the world has more than one rank: an error on one rank would otherwise leave
// the others waiting in a collective. Returns when there is nothing to abort.
void mpi_abort_others(int code);

}  // namespace megakern
