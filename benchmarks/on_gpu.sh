#!/usr/bin/env bash
# The GPU checks, on a GPU machine, from the repository root (gpurig on PYTHONPATH, no install needed):
#   OUT=/tmp/gpu bash benchmarks/on_gpu.sh
# doctor (NVML), bench (collectives on GPU tensors, host<->device pinned vs pageable, GEMM tile effect),
# codec throughput on the GPU, and training on the GPU: one rank over NCCL, two ranks over MPI (staged)
# with int8 and PowerSGD compression. Each part's output goes to $OUT.
set -u
OUT=${OUT:-/tmp/gpurig-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PY=${PYTHON:-python3}
step() { echo; echo "== $1"; }
step "versions"
nvidia-smi -L; $PY -c "import torch, mpi4py; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), 'nccl', torch.cuda.nccl.version(), 'mpi4py', mpi4py.__version__)"
step "gpurig doctor"
timeout 120 $PY -m gpurig doctor --write-spec "$OUT/spec.toml" 2>&1 | tee "$OUT/doctor.txt"
step "gpurig bench (GPU parts)"
timeout 300 $PY -m gpurig bench --quick --parts gemm,copy,loading,disk --out "$OUT/profile.json" --plot "$OUT" 2>&1 | tee "$OUT/bench.txt"
step "codec throughput on the GPU"
timeout 120 $PY benchmarks/codec_throughput.py --device cuda --out "$OUT/codecs-gpu.json" && cat "$OUT/codecs-gpu.json"
step "predict vs measured training steps on this GPU"
timeout 300 $PY benchmarks/gpu_validation.py --out "$OUT/gpu_validation.json"
step "train: 1 rank, torch engine (NCCL), int8"
timeout 300 $PY -m gpurig train -n 1 --engine torch --epochs 2 --compression int8 --checkpoint-dir /tmp/ck1 --json 2>&1 | tail -40
step "train: 2 ranks over MPI on one GPU (host-staged), int8 and powersgd"
for c in int8 powersgd; do
  timeout 300 $PY -m gpurig train -n 2 --engine mpi --epochs 2 --compression $c --checkpoint-dir /tmp/ck-$c --json 2>&1 | tail -12
done
