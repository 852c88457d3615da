"""Precision as the frameworks run it: which peak a GPU's matrix multiplies reach, and how many bytes move.

``--precision`` names what a PyTorch user sets:

- ``fp32`` — PyTorch's default: matrix multiplies in FP32 on the CUDA cores
  (``torch.backends.cuda.matmul.allow_tf32`` is off since PyTorch 1.12), but
  convolutions in TF32 on tensor cores where the GPU has them (Ampere and later:
  ``torch.backends.cudnn.allow_tf32`` is on by default).
- ``tf32`` — both in TF32 (``torch.set_float32_matmul_precision("high")``).
- ``fp16``, ``bf16`` — automatic mixed precision (``torch.autocast``): matrix
  multiplies and convolutions on 16-bit tensor cores, activations stored in 16
  bits, FP32 master weights and optimizer state, the weights cast to 16 bits each
  step and their gradients back, and for ``fp16`` a loss scaler.
- ``fp8`` — FP8 matrix multiplies of linear layers (NVIDIA Transformer Engine) on
  GPUs with FP8 tensor cores; everything else as ``bf16``.

Where a GPU lacks the tensor cores a precision asks for, frameworks still run
it — 16-bit storage with FP32 arithmetic, TF32 requests ignored — and the
prediction says so in :attr:`Precision.note` (never silently).

>>> from gpurig.spec import catalog
>>> p = precision_on(catalog.gpu("A100"), "fp32")
>>> p.linear_tflops, p.conv_tflops, p.element_bytes
(19.5, 156.0, 4)
>>> precision_on(catalog.gpu("GTX 1080 Ti"), "fp16").note
'the GeForce GTX 1080 Ti has no FP16 tensor cores: fp16 runs as 16-bit storage with FP32 arithmetic'
"""

from __future__ import annotations

from dataclasses import dataclass

from gpurig.errors import UsageError

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
MIXED = ("fp16", "bf16", "fp8")
# Convolutions' activation layout (``--memory-format``). cuDNN's 16-bit tensor-core convolutions compute in NHWC:
# on PyTorch's default NCHW (``contiguous``) tensors each one transposes its input and output around the kernel
# (forward; its gradients in backward), which ``channels-last`` tensors (``model.to(memory_format=
# torch.channels_last)``, NVIDIA's ConvNets and SSD under AMP) skip. NVIDIA, "Convolutional Layers User's Guide"
# (Deep Learning Performance docs), "Tensor Layouts In Memory: NCHW vs NHWC": NCHW inputs to Tensor Core
# convolutions are transposed by extra kernels. FP32 and TF32 convolutions are priced the same either way.
MEMORY_FORMATS = ("contiguous", "channels-last")
# What automatic mixed precision moves per parameter per step besides the optimizer: forward reads the FP32
# weight and writes its 16-bit copy (4 + 2 bytes); backward reads the 16-bit gradient and adds it to the FP32
# one (2 + 4).
CAST_BYTES_PER_PARAM = 6


@dataclass(frozen=True)
class Precision:
    """How one precision runs on one GPU: the peaks its GEMMs reach and the bytes per activation."""

    name: str
    linear_tflops: float
    conv_tflops: float
    linear_tensor_cores: bool
    conv_tensor_cores: bool
    element_bytes: int
    cast_bytes_per_param: float
    note: str = ""
    cuda_tflops: float = 0.0    # the same type on the CUDA cores (no tensor cores): FP32, or FP16 where it is fast


def check(name: str) -> str:
    """``name`` if it is a precision gpurig knows; one line with the choices otherwise.

    >>> check("tf32")
    'tf32'
    >>> check("int4")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: unknown precision 'int4'; choose one of: fp32, tf32, fp16, bf16, fp8
    """
    if name not in PRECISIONS:
        raise UsageError(f"unknown precision {name!r}; choose one of: {', '.join(PRECISIONS)}")
    return name


def check_memory_format(name: str) -> str:
    """``name`` if it is a memory format gpurig prices; one line with the choices otherwise.

    >>> check_memory_format("channels-last")
    'channels-last'
    >>> check_memory_format("nhwc")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: unknown memory format 'nhwc'; choose one of: contiguous, channels-last
    """
    if name not in MEMORY_FORMATS:
        raise UsageError(f"unknown memory format {name!r}; choose one of: {', '.join(MEMORY_FORMATS)}")
    return name


def pytorch_nchw_batch_norm(precision: str, memory_format: str) -> bool:
    """Whether batch norm runs PyTorch's own NCHW kernels rather than cuDNN's: bf16 (fp8's other layers run as bf16)
    on NCHW tensors. cuDNN's batch norm takes FP32 and FP16 with FP32 weights, never BF16 (PyTorch's
    ``_select_batch_norm_backend``); channels-last tensors get PyTorch's fast NHWC kernels.

    >>> pytorch_nchw_batch_norm("bf16", "contiguous"), pytorch_nchw_batch_norm("fp16", "contiguous")
    (True, False)
    """
    return precision in ("bf16", "fp8") and memory_format == "contiguous"


def cudnn_nhwc_batch_norm(precision: str, memory_format: str) -> bool:
    """Whether batch norm runs cuDNN's NHWC kernels (its persistent ``batchnorm_*_nhwc`` ones, faster than
    PyTorch's channels-last kernels): FP16 with FP32 weights on channels-last tensors. FP32 channels-last and bf16
    take PyTorch's; NCHW tensors cuDNN's per-channel kernels (FP32, FP16) or PyTorch's (bf16).

    >>> cudnn_nhwc_batch_norm("fp16", "channels-last"), cudnn_nhwc_batch_norm("bf16", "channels-last")
    (True, False)
    """
    return precision == "fp16" and memory_format == "channels-last"


def precision_on(gpu, name: str) -> Precision:
    """What ``name`` means on ``gpu`` (a catalog GPU), as PyTorch runs it.

    >>> from gpurig.spec import catalog
    >>> h100 = catalog.gpu("H100")
    >>> [precision_on(h100, p).linear_tflops for p in PRECISIONS]
    [67.0, 494.5, 989.0, 989.0, 1978.0]
    >>> precision_on(catalog.gpu("V100"), "fp8")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --precision fp8 needs FP8 tensor cores (Ada, Hopper, Blackwell, MI300); the Tesla V100 SXM2 16 GB has none
    """
    check(name)
    fp32 = gpu.fp32_tflops
    tf32, fp16, bf16, fp8 = gpu.tf32_tflops, gpu.tensor_tflops, gpu.bf16_tflops, gpu.fp8_tflops
    notes = []
    if name == "fp32":
        conv = tf32 or fp32
        return Precision(name, fp32, conv, False, bool(tf32), 4, 0.0,
                         "convolutions in TF32 (PyTorch's default on this GPU), matrix multiplies in FP32" if tf32
                         else "", cuda_tflops=fp32)
    if name == "tf32":
        if not tf32:
            notes.append(f"the {gpu.name} has no TF32 tensor cores: PyTorch runs tf32 as fp32")
        peak = tf32 or fp32
        return Precision(name, peak, peak, bool(tf32), bool(tf32), 4, 0.0, "; ".join(notes), cuda_tflops=fp32)
    if name == "fp8" and not fp8:
        raise UsageError(f"--precision fp8 needs FP8 tensor cores (Ada, Hopper, Blackwell, MI300); "
                         f"the {gpu.name} has none")
    sixteen = fp16 if name == "fp16" else bf16
    if not sixteen:
        notes.append(f"the {gpu.name} has no {name.upper()} tensor cores: {name} runs as 16-bit storage "
                     "with FP32 arithmetic")
    conv = sixteen or fp32
    linear = fp8 if name == "fp8" else conv
    # 16-bit arithmetic on the CUDA cores runs at the FP16 rate where that is fast (2x FP32 from Volta on), else
    # at FP32 (Pascal's GeForce: 1/64)
    cuda = max(fp32, gpu.fp16_tflops or 0.0) if name == "fp16" else fp32
    return Precision(name, linear, conv, bool(sixteen) or name == "fp8", bool(sixteen), 2, CAST_BYTES_PER_PARAM,
                     "; ".join(notes), cuda_tflops=cuda)
