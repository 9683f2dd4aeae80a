// The communicator the collective ops (ops::AllReduce, ops::AllGather) call:
// the ranks of one tensor-parallel group, each running its own part of a
// partitioned program (dist/tensor_parallel.h). Implementations: an
// in-process group of threads (dist/local_comm.h) and MPI
// (dist/mpi_comm.h, built when MPI is found).
#pragma once

#include <cstddef>
#include <cstdint>

namespace megakern {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank passes its counts[rank] floats in `send`; every rank receives
  // all ranks' floats in rank order (rank p's at the sum of counts[0..p)).
  // counts has size() entries, the same on every rank. Blocks until all
  // ranks have called it.
  virtual void all_gather(const float* send, const size_t* counts, float* recv) = 0;
  // Rank `root`'s n values into every rank's `data`.
  virtual void broadcast(int32_t* data, size_t n, int root) = 0;

  // Totals over the calls so far: floats sent by this rank (its share of
  // each all_gather), and the seconds spent inside the calls.
  uint64_t sent_floats = 0;
  double seconds = 0;
};

// Columns [begin, end) of rank p's share when `width` columns (or heads, or
// rows) are split between `ranks` ranks: contiguous, in rank order, the
// shares differing by at most one.
inline int share_begin(int width, int ranks, int p) {
  return static_cast<int>(static_cast<int64_t>(width) * p / ranks);
}
inline int share_width(int width, int ranks, int p) {
  return share_begin(width, ranks, p + 1) - share_begin(width, ranks, p);
}

}  // namespace megakern
