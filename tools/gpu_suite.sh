#!/usr/bin/env bash
# Everything that needs the GPU, in one device call: unpack torch-mlir (carried as .carry/),
# build the extension in place, run every test (CUDA ones included), run the benchmarks.
# Writes logs and JSON under $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT" /tmp/site
export PYTHONUNBUFFERED=1
if [[ -f .carry/torch_mlir_cp312.tar.xz ]]; then
  tar xJf .carry/torch_mlir_cp312.tar.xz -C /tmp/site
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
if ls .whl/*.whl >/dev/null 2>&1; then  # expecttest etc., absent from the GPU image
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
( time python3 setup.py build_ext --inplace ) > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 -m pytest -q tests -x -p no:cacheprovider > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -5 "$OUT/pytest.log"
if [[ "${BENCH_LAUNCH:-1}" == 1 ]]; then
  python3 tools/bench_launch.py --out "$OUT/bench_launch.json" 2>&1 | tee "$OUT/bench_launch.log" | tail -20
fi
if [[ "${BENCH_DECODE:-1}" == 1 ]]; then
  python3 tools/bench_decode.py --out "$OUT/bench_decode.json" --budget-s "${DECODE_BUDGET_S:-360}" \
    --models "${DECODE_MODELS:-llama,qwen}" --batches "${DECODE_BATCHES:-1,8}" 2>&1 | grep -v "^W1" | tee "$OUT/bench_decode.log" | tail -20
fi
