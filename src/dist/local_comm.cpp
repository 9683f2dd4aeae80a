#include "dist/local_comm.h"

#include <chrono>
#include <cstring>

#include "core/error.h"

namespace megakern {

// What the ranks publish for a call: pointers into their own buffers, valid
// until the call's second barrier (after which every rank has read them).
struct LocalGroup::Shared {
  explicit Shared(int n) : sync(n), send(static_cast<size_t>(n)), bcast(nullptr) {}
  std::barrier<> sync;
  std::vector<const float*> send;
  const int32_t* bcast;
};

class LocalGroup::Rank final : public Communicator {
 public:
  Rank(Shared& s, int rank, int size) : s_(s), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const float* send, const size_t* counts, float* recv) override {
    const auto t0 = std::chrono::steady_clock::now();
    s_.send[static_cast<size_t>(rank_)] = send;
    s_.sync.arrive_and_wait();
    for (int p = 0; p < size_; ++p) {
      std::memcpy(recv, s_.send[static_cast<size_t>(p)], sizeof(float) * counts[p]);
      recv += counts[p];
    }
    s_.sync.arrive_and_wait();
    sent_floats += counts[rank_];
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void broadcast(int32_t* data, size_t n, int root) override {
    MK_CHECK(root >= 0 && root < size_, "broadcast from rank {} of a group of {}", root, size_);
    if (rank_ == root) s_.bcast = data;
    s_.sync.arrive_and_wait();
    if (rank_ != root) std::memcpy(data, s_.bcast, sizeof(int32_t) * n);
    s_.sync.arrive_and_wait();
  }

 private:
  Shared& s_;
  int rank_, size_;
};

LocalGroup::LocalGroup(int n) {
  if (n < 1) fail("a tensor-parallel group needs at least one rank, got {}", n);
  shared_ = std::make_unique<Shared>(n);
  for (int p = 0; p < n; ++p) ranks_.push_back(std::make_unique<Rank>(*shared_, p, n));
}

LocalGroup::~LocalGroup() = default;

Communicator& LocalGroup::rank(int p) {
  MK_CHECK(p >= 0 && p < size(), "rank {} of a group of {}", p, size());
  return *ranks_[static_cast<size_t>(p)];
}

}  // namespace megakern
