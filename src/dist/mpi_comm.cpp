// MPI communicator (compiled only when CMake finds MPI).
#include "dist/mpi_comm.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <vector>

#include "core/error.h"

namespace megakern {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("{} failed: {}", what, std::string(msg, static_cast<size_t>(len)));
}

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      if (provided < MPI_THREAD_SERIALIZED)
        fail("MPI gives thread level {}, the collective ops need MPI_THREAD_SERIALIZED ({})", provided,
             static_cast<int>(MPI_THREAD_SERIALIZED));
      owns_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiWorld() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const float* send, const size_t* counts, float* recv) override {
    const auto t0 = std::chrono::steady_clock::now();
    counts_.resize(static_cast<size_t>(size_));
    displs_.resize(static_cast<size_t>(size_));
    size_t off = 0;
    for (int p = 0; p < size_; ++p) {
      MK_CHECK(counts[p] <= static_cast<size_t>(INT_MAX) && off <= static_cast<size_t>(INT_MAX),
               "all_gather of {} floats is beyond MPI's int counts", counts[p]);
      counts_[static_cast<size_t>(p)] = static_cast<int>(counts[p]);
      displs_[static_cast<size_t>(p)] = static_cast<int>(off);
      off += counts[p];
    }
    check(MPI_Allgatherv(send, counts_[static_cast<size_t>(rank_)], MPI_FLOAT, recv, counts_.data(), displs_.data(),
                         MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Allgatherv");
    sent_floats += counts[rank_];
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void broadcast(int32_t* data, size_t n, int root) override {
    MK_CHECK(n <= static_cast<size_t>(INT_MAX), "broadcast of {} values", n);
    check(MPI_Bcast(data, static_cast<int>(n), MPI_INT32_T, root, MPI_COMM_WORLD), "MPI_Bcast");
  }

 private:
  int rank_ = 0, size_ = 1;
  bool owns_ = false;
  std::vector<int> counts_, displs_;
};

MpiWorld* g_world = nullptr;

}  // namespace

bool mpi_available() { return true; }

Communicator& mpi_world() {
  static MpiWorld world;
  g_world = &world;
  return world;
}

void mpi_abort_others(int code) {
  if (g_world == nullptr || g_world->size() < 2) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace megakern
