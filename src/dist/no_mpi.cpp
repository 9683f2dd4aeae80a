// mpi_world() and friends in a build without MPI (CMake compiles this file
// instead of dist/mpi_comm.cpp when it finds no MPI).
#include "core/error.h"
#include "dist/mpi_comm.h"

namespace megakern {

bool mpi_available() { return false; }

Communicator& mpi_world() {
  fail("this megakern was built without MPI: tensor parallelism over processes needs Open MPI "
       "(Debian: openmpi-bin libopenmpi-dev, installed by scripts/setup.sh) and a rebuild");
}

void mpi_abort_others(int) {}

}  // namespace megakern
