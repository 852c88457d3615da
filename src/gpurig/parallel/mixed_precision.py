"""Mixed precision for training on several ranks: autocast, and for fp16 a loss scaler whose skips the ranks agree on.

``--precision`` takes the words ``gpurig predict`` takes (:mod:`gpurig.perf.precision`):
``fp32`` (PyTorch's default), ``tf32`` (TF32 matrix multiplies and convolutions on
NVIDIA GPUs), ``bf16`` and ``fp16`` (``torch.autocast``: matrix multiplies and
convolutions in 16 bits, the weights and the optimizer state stay FP32 — the
master weights — and gradients reach them in FP32). ``fp8`` needs NVIDIA's
Transformer Engine and is refused here.

fp16's narrow range needs a loss scaler: the loss is multiplied by a scale
before backward, the gradients divided by it after, and a step whose gradients
overflowed is skipped and the scale halved (grown again after 2,000 clean
steps: ``torch.amp.GradScaler``'s defaults). ``GradScaler`` decides per process;
here one small allreduce of "did mine overflow?" makes every rank skip the same
steps, also where ranks hold different gradients (the split layers of model or
hybrid parallelism), so the replicas never drift apart.

>>> mixed = MixedPrecision("bf16", device="cpu")
>>> with mixed.autocast():
...     y = torch.nn.Linear(4, 2)(torch.ones(3, 4))
>>> y.dtype
torch.bfloat16
"""

from __future__ import annotations

import contextlib

import torch

from gpurig.comm import started
from gpurig.errors import UsageError
from gpurig.parallel import numerics
from gpurig.perf.precision import check

AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}
INIT_SCALE, GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000  # GradScaler's defaults
MIN_SCALE = 1.0  # below it the gradients overflow unscaled: not fp16's range but a diverging run


def check_supported(precision: str, device_type: str) -> str:
    """``precision`` if training can run it on ``device_type`` ("cpu", "cuda"); one line saying why not otherwise.

    >>> check_supported("bf16", "cpu")
    'bf16'
    >>> check_supported("tf32", "cpu")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --precision tf32 is a mode of NVIDIA GPUs' tensor cores; these ranks compute on CPU cores (use fp32 or bf16)
    """
    check(precision)
    if precision == "fp8":
        raise UsageError("--precision fp8 needs NVIDIA's Transformer Engine, which gpurig train does not use: "
                         "use bf16 or fp16")
    if precision == "tf32" and device_type != "cuda":
        raise UsageError(f"--precision tf32 is a mode of NVIDIA GPUs' tensor cores; these ranks compute on "
                         f"{device_type.upper()} cores (use fp32 or bf16)")
    if precision in AUTOCAST:
        try:  # torch says itself whether it autocasts to this type on this device
            with torch.autocast(device_type, dtype=AUTOCAST[precision]):
                torch.ones(2, 2, device=device_type) @ torch.ones(2, 2, device=device_type)
        except (RuntimeError, AssertionError) as error:
            raise UsageError(f"--precision {precision}: this torch cannot autocast to it on {device_type} "
                             f"({str(error).splitlines()[0]})") from None
    return precision


class MixedPrecision:
    """Autocast and, for fp16, the loss scaler; every rank skips the same overflowing steps.

    >>> mixed = MixedPrecision("fp16", device="cpu")        # one rank here: no communicator needed
    >>> model = torch.nn.Linear(4, 2); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> def backward():
    ...     with mixed.autocast():
    ...         loss = model(torch.ones(8, 4)).float().mean()
    ...     mixed.scale(loss).backward()
    >>> backward(); mixed.step(optimizer), mixed.scale_value       # stepped, the scale unchanged
    (True, 65536.0)
    >>> backward(); _ = model.weight.grad.fill_(float("inf"))     # an overflow
    >>> mixed.step(optimizer), mixed.scale_value, mixed.skipped_steps, model.weight.grad
    (False, 32768.0, 1, None)
    """

    def __init__(self, precision: str = "fp32", comm=None, device: torch.device | str | None = None,
                 nonfinite: str = "stop", init_scale: float = INIT_SCALE, growth_interval: int = GROWTH_INTERVAL,
                 check_finite: bool = False):
        self.precision = check(precision)
        self.comm = comm  # None: the job's own (:meth:`step` looks it up), which DataParallel starts
        # autocast needs the device type only: the communicator's rule (a GPU where there is one) without one
        self.device = torch.device(device if device is not None else comm.device if comm is not None
                                   else "cuda" if torch.cuda.is_available() else "cpu")
        check_supported(precision, self.device.type)
        self.nonfinite = numerics.check_action(nonfinite)
        if precision == "fp16" and nonfinite == "ignore":
            raise UsageError("--precision fp16 checks every step's gradients for overflow (its loss scaler): "
                             "use --on-nonfinite stop or skip")
        self.scaling = precision == "fp16"
        # gradients no DataParallel guards (model parallelism's split layers): looked at here, every rank together
        self.checking = self.scaling or (check_finite and nonfinite != "ignore")
        self.scale_value = init_scale if self.scaling else 1.0
        self.growth_interval = growth_interval
        self._clean_steps = 0
        self.skipped_steps = 0
        self.steps = 0
        if self.device.type == "cuda":  # TF32 where asked; fp32 is PyTorch's default (TF32 convolutions only)
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"

    def autocast(self):
        """The forward pass's context: ``torch.autocast`` for fp16 and bf16, nothing otherwise."""
        if self.precision in AUTOCAST:
            return torch.autocast(self.device.type, dtype=AUTOCAST[self.precision])
        return contextlib.nullcontext()

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward()`` on: multiplied by the scale with fp16, as it is otherwise."""
        return loss * self.scale_value if self.scaling else loss

    def step(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None = None) -> bool:
        """Unscale the gradients, agree with the other ranks whether any overflowed, then step or skip; return
        whether it stepped.

        A skipped step leaves the weights and the optimizer state alone, halves the
        scale, and zeroes the error-feedback residuals of ``model``'s
        :class:`~gpurig.parallel.DataParallel` that the overflow made NaN. With
        ``nonfinite="stop"``, overflowing at a scale below 1 raises
        :class:`~gpurig.parallel.NonFiniteGradientError` on every rank (the run
        diverges); ``"skip"`` goes on skipping. With ``check_finite`` (gradients no
        DataParallel averages and guards, as model parallelism's split layers), the
        other precisions are checked the same way: NaN or Inf on any rank stops
        every rank, or skips the step on every rank.
        """
        self.steps += 1
        if not self.checking:
            optimizer.step()
            return True
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        grads = [p.grad for p in params]
        if grads and self.scaling:
            torch._foreach_mul_(grads, 1.0 / self.scale_value)
        finite = numerics.all_finite([g.reshape(-1) for g in grads])
        comm = self.comm if self.comm is not None else started()
        if comm is not None and comm.size > 1:  # the ranks' verdicts, one byte each: skip if any overflowed
            flag = torch.tensor([0.0 if finite else 1.0])
            finite = comm.allreduce(flag, op="sum", name="loss scaler overflow").item() == 0.0
        if finite:
            optimizer.step()
            self._clean_steps += 1
            if self.scaling and self._clean_steps == self.growth_interval:
                self.scale_value *= GROWTH_FACTOR
                self._clean_steps = 0
            return True
        if self.nonfinite == "stop" and (not self.scaling or self.scale_value * BACKOFF_FACTOR < MIN_SCALE):
            names = {id(p): n for n, p in (model.named_parameters() if model is not None else [])}
            bad = numerics.first_nonfinite([(names.get(id(p), "?"), p.grad) for p in params])
            name, kind = bad if bad is not None else ("a parameter on another rank", "NaN or Inf")
            scale = f" even with the fp16 loss scale at {self.scale_value:g}" if self.scaling else ""
            raise numerics.NonFiniteGradientError(f"step {self.steps}: the gradient of {name!r} holds {kind}{scale}",
                                                  step=self.steps, parameter=name, kind=kind)
        for p in params:
            p.grad = None
        for module in (model.modules() if model is not None else ()):
            if hasattr(module, "drop_nonfinite_feedback"):
                module.drop_nonfinite_feedback()
        if self.scaling:
            self.scale_value *= BACKOFF_FACTOR
        self._clean_steps = 0
        self.skipped_steps += 1
        return False

    def state_dict(self) -> dict:
        """The scaler's state, for checkpoints (a resumed run goes on with the same scale)."""
        return {"precision": self.precision, "scale": self.scale_value, "clean_steps": self._clean_steps,
                "skipped_steps": self.skipped_steps, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (from a run of any precision: only fp16's scale carries over)."""
        if state.get("precision") == self.precision:
            self.scale_value, self._clean_steps = state["scale"], state["clean_steps"]
            self.skipped_steps, self.steps = state["skipped_steps"], state["steps"]
