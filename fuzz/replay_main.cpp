// A stand-alone driver for the fuzz targets (fuzz/fuzz_<target>.cpp) where
// no libFuzzer is at hand (GCC builds): every file named, or found under a
// directory named, goes once through LLVMFuzzerTestOneInput. Built with the
// test suite (fuzz_replay_<target>) and run by ctest over the committed
// corpora (fuzz/corpus/<target>/), so that a sanitizer build replays them.
//   fuzz_replay_<target> [--head BYTES] PATH...
// --head feeds only the first BYTES of each file (the GGUF target gets the
// header and metadata of the fetched models this way, as scripts/fuzz.sh
// does). An input that crashes stops the run in the target; the driver
// prints the file before feeding it, so the log names the culprit. Exit 1
// when no input was found (a corpus that went missing is not a pass), 2 on
// a bad command line.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  size_t head = 0;  // 0: whole files
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--head") {
      char* end = nullptr;
      const unsigned long long v = i + 1 < argc ? std::strtoull(argv[i + 1], &end, 10) : 0;
      if (i + 1 >= argc || end == argv[i + 1] || *end != '\0' || v == 0) {
        std::fprintf(stderr, "fuzz replay: --head needs a positive byte count\n");
        return 2;
      }
      head = static_cast<size_t>(v);
      ++i;
    } else if (fs::is_directory(a)) {
      for (const auto& e : fs::recursive_directory_iterator(a))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(a)) {
      files.push_back(a);
    } else {
      std::fprintf(stderr, "fuzz replay: '%s' is neither a file nor a directory\n", a.c_str());
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "fuzz replay: no input files found\n");
    return 1;
  }
  size_t bytes = 0;
  for (const fs::path& p : files) {
    std::printf("replay %s\n", p.c_str());
    std::fflush(stdout);
    std::ifstream f(p, std::ios::binary);
    std::vector<uint8_t> data;
    if (head > 0) {
      data.resize(head);
      f.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(head));
      data.resize(static_cast<size_t>(f.gcount()));
    } else {
      data.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    if (f.bad()) {
      std::fprintf(stderr, "fuzz replay: cannot read '%s'\n", p.c_str());
      return 1;
    }
    // libFuzzer hands the target a buffer of exactly the input's size; a
    // heap copy keeps reads past the end visible to AddressSanitizer.
    std::vector<uint8_t> exact(data.begin(), data.end());
    LLVMFuzzerTestOneInput(exact.data(), exact.size());
    bytes += exact.size();
  }
  std::printf("fuzz replay: %zu inputs (%zu bytes), no failure\n", files.size(), bytes);
  return 0;
}
