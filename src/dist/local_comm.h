// An in-process tensor-parallel group: N ranks that are threads of one
// process, exchanging through shared memory. Runs the per-rank programs of a
// partition (dist/tensor_parallel.h) in one process, with the collectives
// summing and concatenating in the same rank order as over MPI: the same
// bits, which is what the multi-process runs are checked against.
#pragma once

#include <barrier>
#include <memory>
#include <vector>

#include "ir/collective.h"

namespace megakern {

class LocalGroup {
 public:
  // A group of n >= 1 ranks; each rank's calls must come from its own thread
  // (every rank blocks in a collective until all have reached it).
  explicit LocalGroup(int n);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;
  int size() const { return static_cast<int>(ranks_.size()); }
  Communicator& rank(int p);

 private:
  class Rank;
  struct Shared;
  std::unique_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace megakern
