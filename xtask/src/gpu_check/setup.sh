# Sourced by run.sh and sanitize.sh on the device machine (no Rust there; python3 with
# PyTorch's CUDA wheels): prints the GPU and its driver, finds libcuda, cuBLAS, NVRTC, the
# fp16/bf16 headers and compute-sanitizer, and makes sure the kernels' cubins load (the
# bundled ones, else ones compiled here with this machine's NVRTC). Everything it prints also
# goes to $OUT/setup.log.
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
log="$out/setup.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }

say "== GPU and driver"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | tee -a "$log" \
    || nvidia-smi 2>&1 | tee -a "$log"
else
  say "nvidia-smi: not found"
fi

# libcuda: the loader's own path first, then the folders drivers are installed in.
cuda_dirs=""
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/compat /usr/local/cuda/lib64; do
  if [ -e "$d/libcuda.so.1" ]; then cuda_dirs="${cuda_dirs:+$cuda_dirs:}$d"; fi
done
say "libcuda.so.1 in: ${cuda_dirs:-<none of the usual folders; the loader's path only>}"

# cuBLAS, NVRTC, the CUDA headers and compute-sanitizer from the `nvidia` wheels.
found=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
libs, include, sanitizer = set(), "", ""
for r in roots:
    for pat in ("libcublas.so*", "libcublasLt.so*", "libnvrtc.so*", "libnvrtc-builtins.so*"):
        for f in glob.glob(os.path.join(r, "**", pat), recursive=True):
            libs.add(os.path.dirname(f))
    for f in glob.glob(os.path.join(r, "**", "cuda_fp16.h"), recursive=True):
        include = include or os.path.dirname(os.path.dirname(f))
    for f in glob.glob(os.path.join(r, "**", "compute-sanitizer"), recursive=True):
        if os.path.isfile(f) and os.access(f, os.X_OK):
            sanitizer = sanitizer or f
print("libs=" + ":".join(sorted(libs)))
print("cuda_home=" + include)
print("sanitizer=" + sanitizer)
PY
)
libs=$(echo "$found" | sed -n 's/^libs=//p')
wheel_home=$(echo "$found" | sed -n 's/^cuda_home=//p')
wheel_sanitizer=$(echo "$found" | sed -n 's/^sanitizer=//p')
export LD_LIBRARY_PATH="${libs}${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "cuBLAS/NVRTC from: ${libs:-<not found>}"
# NVRTC before 13.3 needs the toolkit's fp16/bf16 headers ($CUDA_HOME/include).
if [ -z "$CUDA_HOME" ] && [ ! -e /usr/local/cuda/include/cuda_fp16.h ] && [ -n "$wheel_home" ]; then
  export CUDA_HOME="$wheel_home"
fi
say "CUDA headers: ${CUDA_HOME:-/usr/local/cuda}/include"
for s in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer "$wheel_sanitizer"; do
  if [ -n "$s" ] && [ -x "$s" ]; then export COMPUTE_SANITIZER="$s"; break; fi
done
say "compute-sanitizer: ${COMPUTE_SANITIZER:-<not found>}"

# The cubins: the bundled ones when one of them loads, else compiled here (16 cores).
export ATTN_KERNELS_CUBIN_DIR="$here/cubins"
say "== cubin probe"
probe=$(timeout 60 "$here/gpu_check" --probe 2>&1)
probe_status=$?
say "$probe"
if [ "$probe_status" -eq 3 ]; then
  arch=$(echo "$probe" | sed -n 's/.*arch=\(sm_[0-9a-z]*\).*/\1/p' | head -n 1)
  say "the bundled cubins do not load here: compiling every kernel for ${arch:-sm_90} with this machine's NVRTC"
  if timeout 150 "$here/gpu_check" --precompile /tmp/gpu-check-cubins --arch "${arch:-sm_90}" >>"$log" 2>&1; then
    export ATTN_KERNELS_CUBIN_DIR=/tmp/gpu-check-cubins
    say "compiled into $ATTN_KERNELS_CUBIN_DIR"
  else
    say "compiling failed (see setup.log); each process will try its own modules"
  fi
elif [ "$probe_status" -ne 0 ]; then
  say "the probe failed (status $probe_status): the sections will report why"
fi
