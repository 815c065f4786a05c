#!/usr/bin/env bash
# One call on a lent NVIDIA GPU, prepared so that a session's few minutes of device time go to
# measuring, not to setting up (issue 55, item 5). From the repository root, there:
#
#     bash benchmarks/gpu_session.sh        # $OUT: where the results go (./gpu-out by default)
#
# with the wheels the machine lacks carried in .whl/ (made here first by
# ``bash benchmarks/gpu_wheels.sh``), and a timeout of about 600 s.
# In order, each step under a timeout of its own, so that one slow step leaves the others'
# results, all written to $OUT (ten files, what the device tool brings back):
#   1. summary.txt: the GPU, its driver, torch, Triton and CuPy versions, then each step's exit
#      status and time;
#   2. tests-cuda.txt: the Triton kernels on torch CUDA tensors held to the generic path (the
#      fused prologue's included), with the compiled and CUDA-graph tests where they run;
#   3. prologue-gpu.txt, prologue-gpu.json: benchmarks/bench_prologue_gpu.py, the fused
#      attention prologue (Triton) against its steps apart and a copy of its bytes, at a decode
#      step, a prefill and one sequence of 1 to 8192 tokens (issue 56);
#   4. tests-cupy.txt: the CuPy kernel (rope.cu under NVRTC) held to the generic path;
#   5. triton-report.json: tests/triton_report.py with the machine's Triton (registers, spills,
#      access widths of every kernel the benchmark launches, compiled for this GPU);
#   6. gpu.json, gpu.md, bench-log.txt: benchmarks/bench_gpu.py at the "step" sizes, torch and
#      CuPy, bfloat16 and float32, against a copy of the same bytes and the peers (flashinfer's
#      apply_rope_pos_ids among them where its wheel was carried and imports);
#   7. profile.txt: a repeated eager decode call's time per call, back to back (CUDA events),
#      and where its host time goes (cProfile).
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests:$PWD/benchmarks"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

step() {  # step NAME SECONDS COMMAND...: run it under its timeout, its status into summary.txt
    local name=$1 seconds=$2
    shift 2
    local start=$SECONDS
    timeout "$seconds" "$@"
    echo "$name: exit $? in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
    python3 -c "import cupy; print('cupy', cupy.__version__)" 2>&1 | tail -1
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"

# the GPU's own tests first: a step cut short by its timeout keeps what ran (-x: the first failure
# ends it); four processes (pytest-xdist is on the machine), each test to the next free one, the
# open issue's files first
TESTS="-q -x -n 4 -p no:cacheprovider -W ignore::DeprecationWarning"
step tests-cuda 200 python3 -m pytest $TESTS --backend=torch-cuda \
    tests/test_prologue_triton.py tests/test_prologue.py tests/test_triton.py tests/test_plans.py tests/test_kernels.py \
    > "$OUT/tests-cuda.txt" 2>&1
# the open issue's measurements next, before the steps a cut-short session can spare
step prologue 90 python3 benchmarks/bench_prologue_gpu.py --out "$OUT" > "$OUT/prologue-gpu.txt" 2>&1
step tests-cupy 100 python3 -m pytest $TESTS --backend=cupy \
    tests/test_kernels.py tests/test_rope.py tests/test_prologue.py > "$OUT/tests-cupy.txt" 2>&1
step triton-report 60 python3 tests/triton_report.py --json "$OUT/triton-report.json" > /dev/null 2>&1
step bench 180 python3 benchmarks/bench_gpu.py --size step --backend torch --backend cupy \
    --dtype bfloat16 --dtype float32 --rounds 5 --out "$OUT" > "$OUT/bench-log.txt" 2>&1
step profile 60 python3 - > "$OUT/profile.txt" 2>&1 <<'PY'
import cProfile
import pstats

import torch

import anyrope

# the benchmark's decode step: 32 sequences at their own cache lengths, device positions
q = torch.randn(32, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(32, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
starts = torch.randint(0, 4096, (32,), device="cuda")
rope = anyrope.RoPE(128)
for _ in range(50):
    rope(q, k, offset=starts)
torch.cuda.synchronize()
begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
begin.record()
for _ in range(1000):
    rope(q, k, offset=starts)
end.record()
torch.cuda.synchronize()
print(f"eager decode: {begin.elapsed_time(end):.1f} us per call (1000 back to back, CUDA events)")
profiler = cProfile.Profile()
profiler.enable()
for _ in range(1000):
    rope(q, k, offset=starts)
profiler.disable()
torch.cuda.synchronize()
pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
PY
cat "$OUT/summary.txt"
