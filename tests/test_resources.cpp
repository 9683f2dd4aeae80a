// Resources under pressure: KV cache memory committed only as positions
// fill, contexts that cannot fit refused up front, and a thread team that
// stays prompt when asked for more threads than cores or when it has to
// share them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/zeroed_buffer.h"
#include "model/dense.h"
#include "runtime/model.h"
#include "test_util.h"

namespace megakern {
namespace {

// Resident memory of this process in bytes (/proc/self/statm).
size_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

TEST(Resources, ZeroedBufferCommitsMemoryOnlyWhereWritten) {
  const size_t n = size_t{64} << 20;  // 256 MiB of floats
  const size_t before = rss_bytes();
  ZeroedBuffer<float> b;
  b.assign(n, 0.f);
  EXPECT_EQ(b.size(), n);
  EXPECT_LT(rss_bytes() - std::min(before, rss_bytes()), size_t{32} << 20);
  // Reads see zeros; writes commit only their pages.
  EXPECT_EQ(b[0], 0.f);
  EXPECT_EQ(b[n - 1], 0.f);
  for (size_t i = 0; i < (size_t{4} << 20); ++i) b[i] = 1.f;  // 16 MiB
  const size_t used = rss_bytes() - std::min(before, rss_bytes());
  EXPECT_GE(used, size_t{15} << 20);
  EXPECT_LT(used, size_t{64} << 20);
  // Copies and non-zero fills are real.
  ZeroedBuffer<float> c = b;
  EXPECT_EQ(c[123], 1.f);
  EXPECT_EQ(c[n - 1], 0.f);
  c.assign(10, 2.5f);
  EXPECT_EQ(c[9], 2.5f);
}

TEST(Resources, KVCacheFollowsTheTokensHeld) {
  auto model = load_model("dense-mini");
  const size_t before = rss_bytes();
  // A context of 1M positions: the full cache is hundreds of MiB, but nothing
  // is committed before a position is written.
  SequenceState s = model->new_sequence(1 << 20);
  const size_t full = (s.cache.k.size() + s.cache.v.size()) * sizeof(float);
  ASSERT_GT(full, size_t{256} << 20);
  EXPECT_LT(rss_bytes() - std::min(before, rss_bytes()), size_t{32} << 20);
}

TEST(Resources, AContextThatCannotFitIsRefusedNamingTheSizes) {
  auto model = load_model("dense-mini");
  const size_t phys = physical_memory_bytes();
  ASSERT_GT(phys, 0u);
  // Positions whose K and V together need more than physical memory.
  const SequenceState probe = model->new_sequence(16);
  const double per_position = static_cast<double>(probe.cache.k.size() + probe.cache.v.size()) * 4 / 16;
  const double n = std::min(2.0 * static_cast<double>(phys) / per_position, 2147483647.0);
  ASSERT_GT(n * per_position, static_cast<double>(phys)) << "dense-mini's cache cannot outgrow this machine";
  try {
    model->new_sequence(static_cast<int>(n));
    FAIL() << "a context of " << n << " positions was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("KV cache"), std::string::npos) << msg;
    EXPECT_NE(msg.find("physical memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(static_cast<int>(n))), std::string::npos) << msg;
  }
}

TEST(Resources, ThreadTeamIsCappedAtTheCoresUnlessForced) {
  const int cores = ThreadPool::available_cores();
  ThreadPool capped(cores * 4 + 3);
  EXPECT_EQ(capped.size(), cores);
  ThreadPool forced(cores * 4 + 3, /*oversubscribe=*/true);
  EXPECT_EQ(forced.size(), cores * 4 + 3);
  // An oversubscribed team still finishes many short jobs promptly: waiters
  // sleep instead of spinning against the workers they wait for.
  std::atomic<int64_t> sum{0};
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 300; ++i) forced.run([&](int w) { sum += w; });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  const int64_t n = forced.size();
  EXPECT_EQ(sum.load(), 300 * n * (n - 1) / 2);
}

TEST(Resources, RunWithFarMoreThreadsThanCoresFinishes) {
  // Before the cap, -t 1024 on two cores spun for minutes; `timeout` keeps a
  // regression from hanging the suite.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string cmd =
      std::string("timeout 60 ") + MEGAKERN_BINARY + " run -m dense-mini -p Hi -n 8 --raw -t 1024 2>&1 >/dev/null";
  const auto [status, err] = run_shell(cmd);
  EXPECT_EQ(status, 0) << err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_NE(err.find("threads asked for"), std::string::npos) << err;
}

}  // namespace
}  // namespace megakern
