#!/usr/bin/env bash
# Runs the megakern test suite on a fresh machine: installs what it needs and
# fetches the models (scripts/setup.sh, idempotent), builds, then runs ctest
# and the end-to-end server test with the openai client (scripts/test_server.py).
#   scripts/test.sh              Release build in build/
#   scripts/test.sh --sanitize   ASan + UBSan build in build-asan/
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir=build
cmake_extra=()
server_test_args=()
for arg in "$@"; do
  case "$arg" in
    --sanitize)
      build_dir=build-asan
      cmake_extra=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGAKERN_SANITIZE=ON)
      server_test_args=(--rounds 1)  # the instrumented server is several times slower
      ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "test: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
scripts/setup.sh --no-build
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" -G Ninja "${cmake_extra[@]}"
fi
cmake --build "$build_dir" -j "$(nproc)"
export MEGAKERN_MODELS_DIR="$root/models"
(cd "$build_dir" && ctest --output-on-failure -j "$(nproc)" --timeout 600)
# The server test needs the virtual environment setup.sh makes; without it the
# run fails rather than skipping the test.
if [ ! -x .venv-test/bin/python ]; then
  echo "test: .venv-test/bin/python is missing (scripts/setup.sh creates it); cannot run the server test" >&2
  exit 1
fi
timeout 600 .venv-test/bin/python scripts/test_server.py --binary "$build_dir/megakern" "${server_test_args[@]}"
