#!/usr/bin/env bash
# Runs the megakern test suite on a fresh machine: installs what it needs and
# fetches the models (scripts/setup.sh, idempotent), builds, then runs ctest
# and the end-to-end server test with the openai client (scripts/test_server.py).
# The tests that need the fetched models skip themselves when a model is
# missing; this script does not accept that: it fails when a model is absent
# or when ctest reports a skipped test, unless told --no-models.
#   scripts/test.sh              Release build in build/
#   scripts/test.sh --sanitize   ASan + UBSan build in build-asan/: the subset
#                                of the suite named by sanitize_subset below
#                                (its tests: 871 s of ASan test time, about
#                                10-14 min at ctest -j2 on a shared 2-core
#                                host, plus the build; see README)
#   scripts/test.sh --sanitize-full  the whole suite and the server test in
#                                that build (over 90 min on 2 cores)
#   scripts/test.sh --tsan       ThreadSanitizer build in build-tsan/: only the
#                                tests where threads meet (executors, schedule
#                                and race checker, speculation, runtime, tensor
#                                parallelism's local ranks, the server), by
#                                ctest; see tsan_subset below and README
#   scripts/test.sh --no-models  neither fetch nor require the models (their
#                                tests and the server test are listed as not run)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir=build
cmake_extra=()
server_test_args=()
want_models=1
tsan=0
subset=0
setup_args=(--no-build)
# The sanitizer subset (--sanitize): ctest names (GoogleTest's Suite.Test)
# matching this expression. The code that meets untrusted bytes or computes
# in raw buffers: the kernels against their scalar oracle, the executors and
# schedule, the file loaders and parsers (GGUF, safetensors, config.json,
# metadata), the tokenizers, the chat templates (Jinja), the server's request
# parsing and HTTP layer, the replay of every committed fuzz corpus; and the
# runtime, sampler and the architectures' model tests on the mini presets.
# Left out: speculative decoding (Spec*: its lossless checks alone take over
# 5 CPU-minutes under ASan), whole-model accuracy and command-line runs
# (Fidelity, Perplexity, Cli, ChatReuse, DSparkPublished, the server's
# scheduler), the MEGAKERN_ISA repeats and tensor parallelism: they run the
# same kernels longer (the whole suite under ASan takes over 90 minutes on
# 2 cores: --sanitize-full).
sanitize_subset='^(Kernels|FastKernels|Numerics|VecRows|DType[A-Za-z]*|HalfConversion|F32Tiled|Repack|MuseKernels|MuseQuant'
sanitize_subset+='|Exec|ExecTaps|Ops|Schedule|Archs/ExecArchTest|SequenceState'
sanitize_subset+='|GGUF|GGUFWriterRoundTrip|GGUFRoundTrip|Safetensors[A-Za-z]*|HFConfig|MetadataValidation|KimiConfig|MuseConfig|Qwen38Config|KimiReferenceLayout|MuseReferenceLayout'
sanitize_subset+='|Tokenizer[A-Za-z]*|Models/TokenizerModel|StreamDecoder|ByteVocab|HFTokenizer[A-Za-z]*|Jinja|ChatTemplate[A-Za-z]*|ChatFormats'
sanitize_subset+='|ServerApi|ServerHttp|ServerFormat|ServerChatContent|ServerStop|ServerChat|ServerLogprobs|ServerCli'
sanitize_subset+='|Architecture|Runtime|Sampler|Generator|Generation|Resources|StepPolicy|Dist|Dense|Dense/FamilyTest|Archs/DenseArchTest|Families'
sanitize_subset+='|KimiModel|MuseModel|Qwen38Model|KimiFixture|Qwen38Fixture|KimiTorch|KimiRouter)\.|^fuzz_replay\.'

# The ThreadSanitizer suite (--tsan): every test of the files the TSan build
# compiles (CMakeLists.txt, MEGAKERN_TSAN), by their suites' names.
tsan_subset='^(Exec|ExecTaps|Archs/ExecArchTest|Schedule|RaceCheck|Spec[A-Za-z]*|Runtime|Dist|Server[A-Za-z]*)\.'
# Left out of it: the sweeps that compile and check schedules on one thread
# (no thread meets there; minutes each under ThreadSanitizer), two of which
# build shapes-only Kimi models whose weight reservation (4 TiB of address
# space) ThreadSanitizer's memory layout cannot give; and the two sampling
# distribution tests, whose chi-square sample counts take over ctest's 600 s
# under ThreadSanitizer (on a quiet 2-core Sapphire Rapids host) while their
# threads are the speculative verify steps SpecLossless.* runs too.
tsan_exclude='^(RaceCheck\.FullSizePresets|RaceCheck\.MiniPresetsFullSpread|Schedule\.InvariantsHoldOnEveryArchitecture'
tsan_exclude+='|SpecSampling\.OutputDistributionEqualsPlainSampling|SpecSampling\.RecurrentOutputDistributionEqualsPlainSampling)$'

for arg in "$@"; do
  case "$arg" in
    --sanitize|--sanitize-full)
      build_dir=build-asan
      # -g1: line tables only, enough for the sanitizers' stack traces, and
      # much quicker to compile and link than full debug information.
      cmake_extra=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGAKERN_SANITIZE=ON "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
      server_test_args=(--rounds 1)  # the instrumented server is several times slower
      [ "$arg" = --sanitize ] && subset=1
      ;;
    --tsan)
      build_dir=build-tsan
      cmake_extra=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGAKERN_TSAN=ON "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
      tsan=1
      ;;
    --no-models)
      want_models=0
      setup_args+=(--no-models)
      ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "test: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
scripts/setup.sh "${setup_args[@]}"
if ((want_models)); then
  for m in smollm2-135m gemma3-270m qwen2.5-coder-0.5b; do
    if [ ! -f "models/$m.gguf" ]; then
      echo "test: models/$m.gguf is missing (scripts/setup.sh fetches it); run with --no-models to test without the models" >&2
      exit 1
    fi
  done
fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" -G Ninja "${cmake_extra[@]}"
fi
if ((tsan)); then
  # The ThreadSanitizer build holds only the test files named in
  # CMakeLists.txt (MEGAKERN_TSAN) and the megakern binary they run.
  cmake --build "$build_dir" -j "$(nproc)" --target megakern_tests
else
  cmake --build "$build_dir" -j "$(nproc)"
fi
export MEGAKERN_MODELS_DIR="$root/models"
ctest_log="$build_dir/ctest-last.log"
ctest_args=(--output-on-failure -j "$(nproc)" --timeout 600)
((subset)) && ctest_args+=(-R "$sanitize_subset")
if ((tsan)); then
  # Threads meet in the thread pool, the megakernel's flags and shared tiles,
  # the op-by-op barriers, the speculative generator's steps, the runtime,
  # tensor parallelism's local ranks and the server's scheduler and HTTP
  # layer; their tests under ThreadSanitizer (halt_on_error: the first race
  # fails the test; the report is in the test's output).
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
  ctest_args+=(-R "$tsan_subset" -E "$tsan_exclude")
fi
start=$SECONDS
set +e
(cd "$build_dir" && ctest "${ctest_args[@]}") 2>&1 | tee "$ctest_log"
ctest_status=${PIPESTATUS[0]}
set -e
echo "test: ctest in $build_dir took $((SECONDS - start)) s$( ((subset)) && echo ' (the sanitizer subset)')$( ((tsan)) && echo ' (the ThreadSanitizer suite)')"
# Which instruction-set builds of the kernels this run tested against the
# scalar oracle, and which the host could not run (tests/test_kernels.cpp
# runs every build isa.h's host_runs() allows and prints the lines; ctest
# keeps every test's output in LastTest.log).
isa_lines=$(grep -h '^\[kernels\]' "$build_dir/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u || true)
if [ -n "$isa_lines" ]; then
  ran=$(printf '%s\n' "$isa_lines" | sed -n 's/.*(host runs: \([^;)]*\).*/\1/p' | head -1)
  lacked=$(printf '%s\n' "$isa_lines" | sed -n 's/.*not on this host: \([^)]*\)).*/\1/p' | head -1)
  echo "test: ISA builds of the kernels run here against the scalar oracle: ${ran:-none (scalar only)}; not run, the host lacks them: ${lacked:-none}"
  printf '%s\n' "$isa_lines"
else
  echo "test: no kernel test ran in this run, so no report of the ISA builds"
fi
if [ "$ctest_status" -ne 0 ]; then
  echo "test: ctest failed (status $ctest_status)" >&2
  exit "$ctest_status"
fi
# ctest lists skipped tests (GTEST_SKIP) under "The following tests did not run".
# The only skips that are not a missing model are the AVX2-against-scalar
# comparisons (Kernels.*) on a CPU without AVX2.
skipped_list=$(grep '(Skipped)' "$ctest_log" || true)
if ! grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  skipped_list=$(printf '%s\n' "$skipped_list" | grep -v ' Kernels\.' || true)
fi
skipped=$(printf '%s' "$skipped_list" | grep -c . || true)
if [ "$skipped" -gt 0 ]; then
  if ((want_models)); then
    echo "test: $skipped test(s) skipped although the models are present; a skipped test is a gap, not a pass:" >&2
    printf '%s\n' "$skipped_list" >&2
    exit 1
  fi
  echo "test: --no-models: $skipped test(s) that need the models did not run" >&2
fi
if ((subset)); then
  echo "test: --sanitize: the sanitizer subset passed; the end-to-end server test runs with --sanitize-full"
  exit 0
fi
if ((tsan)); then
  echo "test: --tsan: the ThreadSanitizer suite passed (the end-to-end server test is not run in this build)"
  exit 0
fi
if ((!want_models)); then
  echo "test: --no-models: the end-to-end server test (scripts/test_server.py, needs smollm2-135m) did not run" >&2
  exit 0
fi
# The server test needs the virtual environment setup.sh makes; without it the
# run fails rather than skipping the test.
if [ ! -x .venv-test/bin/python ]; then
  echo "test: .venv-test/bin/python is missing (scripts/setup.sh creates it); cannot run the server test" >&2
  exit 1
fi
timeout 600 .venv-test/bin/python scripts/test_server.py --binary "$build_dir/megakern" "${server_test_args[@]}"
