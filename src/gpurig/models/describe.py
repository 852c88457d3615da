"""A model described layer by layer: parameters, FLOPs, GEMM shapes, activations, memory traffic.

:func:`describe` runs one forward pass of any torch module on the meta device
(shapes only: no memory is allocated, nothing is computed) and returns a
:class:`ModelSpec`, the one description of a model that ``predict`` and
``train`` share. It serialises to JSON (``--json`` output, caching).

Conventions (docs/predict.md says more):

- **Layer**: the work a module does itself, named by its module path, in the
  order it first ran: a leaf module (``layer1.0.conv1``, ``layers.3.mlp.fc``),
  or a container's own code outside its children (a residual add); modules with
  neither parameters nor work of their own are left out. A module called
  several times is one layer, its calls summed. The layers sum to the totals.
- **FLOPs**: ``FlopCounterMode``'s formulas — 2 per multiply-add of matrix
  multiplies and convolutions, attention's two batched matmuls at full
  tokens×tokens (a causal mask not halving them), nothing for bias adds,
  norms, activations, pooling or softmax, which count as bytes moved instead.
- **Backward FLOPs**: per GEMM, one GEMM of the forward's size for each operand
  that needs a gradient: 2× forward for a layer with weights, 1× for the first
  layer (the data needs no gradient), 0 for a frozen layer fed by data;
  attention 2×. **Backward bytes**: 2× forward for work whose inputs need a
  gradient (an approximation: the gradient and the saved input are read).
- **Parameters**: each tensor once, owned by the first layer that uses it (so
  GPT-2's output layer, tied to the token embedding, owns none); buffers such
  as BatchNorm's running statistics are not parameters. A frozen tensor
  (``requires_grad=False``) is a parameter, whose weights take memory, but not a
  trainable one: it has no gradient to average and no optimizer state.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from gpurig.errors import UsageError, one_line
from gpurig.models.ops import NORM_OPS, Gemm, aten
from gpurig.models.autocast import MetaAutocast
from gpurig.models.factory import Placed
from gpurig.models.trace import Charges, SavedActivations, Tracer

KINDS = ("linear", "conv", "embedding", "norm", "attention-matmul", "pool", "activation", "other")
SCHEMA = "gpurig.model/1"


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a :class:`ModelSpec`: what it holds and what one forward pass of the batch costs in it.

    ``parameter_shapes`` are the tensors this layer owns, as (full name, shape),
    in registration order, and ``frozen`` the names of those that need no gradient
    (``requires_grad=False``); ``gemms`` the matrix multiplies it ran, in order;
    ``input_elements`` / ``output_elements`` the elements of the tensors it took
    and returned (summed over calls; multiply by the element size for bytes);
    ``forward_bytes`` / ``backward_bytes`` memory traffic outside GEMMs.
    """

    name: str
    kind: str
    module: str
    calls: int
    parameters: int
    parameter_bytes: int
    parameter_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    forward_flops: int
    backward_flops: int
    gemms: tuple[Gemm, ...]
    input_elements: int
    output_elements: int
    forward_bytes: int
    backward_bytes: int
    # parts of the two above: vector-bound operators' (transcendentals, random numbers) and those autocast runs in
    # float32 (:mod:`gpurig.models.ops`); 0 in descriptions written before gpurig told them apart
    forward_vector_bytes: int = 0
    backward_vector_bytes: int = 0
    forward_float32_bytes: int = 0
    backward_float32_bytes: int = 0
    frozen: tuple[str, ...] = ()

    @property
    def trainable_shapes(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The tensors of ``parameter_shapes`` that training updates: each has a gradient, averaged over the
        ranks, and optimizer state.

        >>> frozen = describe(nn.Linear(4, 2).requires_grad_(False), (4,)).layers[0]
        >>> frozen.parameters, frozen.trainable_parameters, frozen.trainable_shapes
        (10, 0, ())
        """
        return tuple((name, shape) for name, shape in self.parameter_shapes if name not in self.frozen)

    @property
    def trainable_parameters(self) -> int:
        """Values of :attr:`trainable_shapes`."""
        return sum(math.prod(shape) for _, shape in self.trainable_shapes)

    @property
    def batch_norm(self) -> bool:
        """Whether the layer is a batch norm (its kernels depend on the precision and layout:
        :func:`gpurig.perf.precision.pytorch_nchw_batch_norm`)."""
        return self.kind == "norm" and "BatchNorm" in self.module


def _total(field: str, doc: str) -> property:
    """A model-wide total: the sum of ``field`` over the layers."""
    return property(lambda spec: sum(getattr(layer, field) for layer in spec.layers), doc=doc)


@dataclass(frozen=True)
class ModelSpec:
    """A model at one batch size: its layers in forward order, and totals over them.

    ``sample`` is the per-sample input shape (without the batch dimension),
    ``input_dtype`` its type ("float32", "int64" for token ids), ``dtype`` the
    parameters' type.

    >>> spec = describe(nn.Linear(784, 10), (784,), batch=32)
    >>> spec.parameters, spec.forward_flops, spec.forward_flops_per_sample
    (7850, 501760, 15680.0)
    >>> ModelSpec.from_json(spec.to_json()) == spec
    True
    """

    name: str
    batch: int
    sample: tuple[int, ...]
    input_dtype: str
    dtype: str
    layers: tuple[LayerSpec, ...]
    # what autograd keeps for backward at the end of forward (float32 as traced), and its largest tensor;
    # 0 in descriptions written before gpurig counted them
    saved_bytes: int = 0
    largest_saved_bytes: int = 0
    # the forward pass's output (float32 as traced: a language model's logits, batch × tokens × vocabulary), which
    # the loss holds with its own copy and backward starts from its gradient; 0 in older descriptions
    output_bytes: int = 0
    # the same three under mixed precision, as CUDA's autocast types each tensor (16-bit products, FP32 norms,
    # softmax and residual sums; :mod:`gpurig.models.autocast`); 0 when not traced (describe's mixed_precision)
    mixed_saved_bytes: int = 0
    mixed_largest_saved_bytes: int = 0
    mixed_output_bytes: int = 0
    # the buffers (BatchNorm's statistics, a causal mask, a rotary table): on the GPU with the weights
    buffer_bytes: int = 0

    parameters = _total("parameters", "Parameters, each tensor once.")
    trainable_parameters = _total("trainable_parameters", "Parameters that need a gradient (not frozen).")
    parameter_bytes = _total("parameter_bytes", "Bytes of the parameters.")
    forward_flops = _total("forward_flops", "FLOPs of one forward pass of the whole batch.")
    backward_flops = _total("backward_flops", "FLOPs of one backward pass of the whole batch (see the conventions).")
    forward_bytes = _total("forward_bytes", "Bytes moved outside GEMMs in one forward pass of the batch.")
    backward_bytes = _total("backward_bytes", "Bytes moved outside GEMMs in one backward pass of the batch.")

    @property
    def forward_flops_per_sample(self) -> float:
        return self.forward_flops / self.batch

    def layer(self, name: str) -> LayerSpec:
        """The layer called ``name`` (a module path).

        >>> describe(nn.Sequential(nn.Linear(4, 2)), (4,)).layer("0").gemms
        (Gemm(m=1, n=2, k=4, count=1),)
        """
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise UsageError(f"model {self.name!r} has no layer {name!r}")

    def totals(self) -> dict:
        """The model-wide numbers, for tables and ``--json``."""
        return {"parameters": self.parameters, "trainable_parameters": self.trainable_parameters,
                "parameter_bytes": self.parameter_bytes,
                "forward_flops": self.forward_flops, "forward_flops_per_sample": self.forward_flops_per_sample,
                "backward_flops": self.backward_flops, "forward_bytes": self.forward_bytes,
                "backward_bytes": self.backward_bytes}

    def to_json(self, indent: int | None = None) -> str:
        """JSON text: the fields, layers with their GEMMs as objects, and the totals (ignored when read back)."""
        return json.dumps({"schema": SCHEMA, **dataclasses.asdict(self), "totals": self.totals()}, indent=indent)

    @classmethod
    def from_json(cls, text: str, where: str = "model description") -> ModelSpec:
        """Read what :meth:`to_json` wrote; anything else is refused in one line."""
        try:
            data = json.loads(text)
            if data.get("schema") != SCHEMA:
                raise ValueError(f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
            layers = tuple(LayerSpec(**{**layer, "gemms": tuple(_gemm(g) for g in layer["gemms"]),
                                        "parameter_shapes": tuple((n, tuple(s)) for n, s in layer["parameter_shapes"]),
                                        "frozen": tuple(layer.get("frozen", ()))})
                           for layer in data["layers"])
            fields = {f.name: data[f.name] if f.default is dataclasses.MISSING else data.get(f.name, f.default)
                      for f in dataclasses.fields(cls)}
            return cls(**{**fields, "sample": tuple(data["sample"]), "layers": layers})
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise UsageError(f"{where}: not a gpurig model description ({type(error).__name__}: {error})") from None


def describe(module: nn.Module, example, batch: int = 1, *, name: str | None = None,
             training: bool = True, mixed_precision: bool = False) -> ModelSpec:
    """Describe ``module`` for one forward pass of ``batch`` samples, on the meta device.

    ``example`` is either a per-sample shape (a float32 input of shape
    ``(batch, *example)``) or a tensor whose first dimension is its batch (its
    other dimensions and its dtype are kept: token ids stay integers). A module
    already on the meta device is used as it is; one with real weights is
    copied to the meta device first — its weights are neither copied nor
    changed (build large models under ``with torch.device("meta")`` to never
    allocate them at all). ``training`` describes the training-mode forward
    pass (dropout, batch statistics), which is what a training step runs.
    ``mixed_precision`` traces the forward pass once more as CUDA's autocast
    runs it, for what a mixed-precision step saves (the ``mixed_*`` fields; a
    second pass, so only when asked).

    >>> from gpurig.models import mlp
    >>> spec = describe(mlp(), (784,), batch=128)
    >>> spec.parameters, spec.forward_flops_per_sample == 2 * (784 * 1200 + 1200 * 1200 + 1200 * 10)
    (2395210, True)
    >>> [(layer.name, layer.kind, layer.gemms[0]) for layer in spec.layers if layer.gemms][0]
    ('1', 'linear', Gemm(m=128, n=1200, k=784, count=1))
    """
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a whole number ≥ 1, got {batch!r}")
    model = on_meta(module)
    x = example_input(example, batch)
    try:  # what the model's code warns of on the meta device (a deprecated indexing) is no news to a plan
        with Placed("meta"), _in_mode(model, training), torch.device("meta"), torch.enable_grad(), \
                Tracer(model) as tracer, \
                SavedActivations(model) as saved, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _held = model(x)    # held until the count ends: what autograd keeps for backward hangs from it
    except Exception as error:  # the model's own code: report it in one line
        raise forward_failed(name or type(module).__name__, x, error) from None
    mixed = _mixed_precision_activations(model, x, training) if mixed_precision else {}
    dtypes = {p.dtype for p in model.parameters()} or {torch.float32}
    return ModelSpec(name=name or type(module).__name__, batch=batch, sample=tuple(x.shape[1:]),
                     input_dtype=_dtype_name(x.dtype), dtype=",".join(sorted(map(_dtype_name, dtypes))),
                     layers=_layers(tracer.charges()), saved_bytes=saved.total_bytes,
                     largest_saved_bytes=saved.largest_bytes, output_bytes=_float_bytes(_held),
                     buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()), **mixed)


def forward_failed(name: str, x: torch.Tensor, error: Exception) -> UsageError:
    """The one line for a forward pass that failed on ``x``: blamed on the meta device (a model that reads
    tensor values) only when the error is the meta device's; otherwise it names the samples the model was fed,
    whose shape or type is then most often what was wrong.

    >>> ids = torch.empty(8, 20, 16, dtype=torch.int64, device="meta")
    >>> print(forward_failed("rnn", ids, ValueError("RNN input dtype (torch.int64) does not match weight dtype")))
    rnn: its forward pass fails on samples of 20x16:int64 (ValueError: RNN input dtype (torch.int64) does not match weight dtype): it takes floating-point values, e.g. 20x16
    >>> print(forward_failed("m", ids, RuntimeError("Tensor.item() cannot be called on meta tensors")))
    m: its forward pass fails on the meta device (RuntimeError: Tensor.item() cannot be called on meta tensors); a model that reads tensor values (.item(), data-dependent shapes) cannot be described without running it
    """
    said = one_line(error)
    if any(word in said.lower() for word in ("meta", "data-dependent", "data-independent")):
        return UsageError(f"{name}: its forward pass fails on the meta device ({said}); a model that reads tensor "
                          "values (.item(), data-dependent shapes) cannot be described without running it")
    sample = "x".join(map(str, x.shape[1:])) or "()"
    fed = sample if x.dtype == torch.float32 else f"{sample}:{_dtype_name(x.dtype)}"
    return UsageError(f"{name}: its forward pass fails on samples of {fed} ({said}): {_input_hint(x, said, sample)}")


def _input_hint(x: torch.Tensor, said: str, sample: str) -> str:
    """What to try, from the error's words: a type mismatch between token ids and values, else the input itself.

    >>> _input_hint(torch.empty(1, 32, device="meta"), "RuntimeError: Expected 'indices' to be Long, Int", "32")
    'it takes token ids, e.g. 32:int64'
    >>> _input_hint(torch.empty(1, 32), "TypeError: Net.forward() missing 1 required positional argument: 'y'", "32")
    'its forward takes more than one input, and --sample describes one tensor: wrap the model in a module whose forward takes one (a factory can build it)'
    """
    lowered = said.lower()
    if "required positional argument" in lowered or "invalid data type 'str'" in lowered:
        # forward(x, y), or forward(batch: dict) indexed by key
        return ("its forward takes more than one input, and --sample describes one tensor: wrap the model in a "
                "module whose forward takes one (a factory can build it)")
    if not x.is_floating_point() and "type" in lowered:  # "dtype", "scalar type", "Input type (long int)"
        return f"it takes floating-point values, e.g. {sample}"
    if x.is_floating_point() and any(word in lowered for word in ("indices", "long", "int64")):
        return f"it takes token ids, e.g. {sample}:int64"
    return "is that the input it takes (its shape per sample, and :int64 for token ids)?"


def _mixed_precision_activations(model: nn.Module, x: torch.Tensor, training: bool) -> dict[str, int]:
    """What a mixed-precision forward pass of ``model`` saves and returns, in bytes, as CUDA's
    autocast types each tensor; nothing (the footprint then halves the FP32 counts) when the model's own code
    cannot run that way on the meta device, which :func:`describe` has already shown it can in FP32."""
    amp = MetaAutocast(torch.float16)
    try:
        with Placed("meta"), _in_mode(model, training), torch.device("meta"), torch.enable_grad(), \
                SavedActivations(model, amp.weight_casts) as saved, amp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _held = model(x)
    except Exception:  # noqa: BLE001 (a model's own code, which FP32 already ran: keep the FP32-derived estimate)
        return {}
    return {"mixed_saved_bytes": saved.total_bytes, "mixed_largest_saved_bytes": saved.largest_bytes,
            "mixed_output_bytes": _float_bytes(_held)}


@contextlib.contextmanager
def _in_mode(model: nn.Module, training: bool):
    """``model`` in training (or eval) mode for the block, each module's own mode restored after it."""
    modes = {m: m.training for m in model.modules()}
    model.train(training)
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


def _float_bytes(output) -> int:
    """Bytes of the floating-point tensors in a forward pass's output (a tensor, or a tuple / list / dict of them),
    as traced.

    >>> _float_bytes((torch.empty(2, 3, device="meta"), torch.empty(5, dtype=torch.int64, device="meta")))
    24
    """
    if isinstance(output, torch.Tensor):
        return output.numel() * output.element_size() if output.is_floating_point() else 0
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return sum(_float_bytes(item) for item in output)
    return 0


def on_meta(module: nn.Module) -> nn.Module:
    """``module`` itself when every parameter and buffer is on the meta device, else a meta-device copy.

    The copy shares nothing with the original and allocates no weights (tied
    parameters stay tied).

    >>> linear = nn.Linear(2, 2)
    >>> on_meta(linear).weight.device, linear.weight.device
    (device(type='meta'), device(type='cpu'))
    """
    tensors = [*module.parameters(), *module.buffers()]
    if all(t.is_meta for t in tensors):
        return module
    memo: dict = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(module, memo)


def example_input(example, batch: int) -> torch.Tensor:
    """A meta tensor of ``batch`` samples from a per-sample shape or an example tensor (first dimension = batch).

    An example that requires grad gives an input that does too: the module is
    then described as a layer fed by an earlier one (its input's gradient is computed).

    >>> example_input((3, 224, 224), 8).shape, example_input(torch.zeros(2, 128, dtype=torch.long), 4).dtype
    (torch.Size([8, 3, 224, 224]), torch.int64)
    >>> example_input(torch.zeros(1, 4, requires_grad=True), 2).requires_grad
    True
    """
    if isinstance(example, torch.Tensor):
        if example.dim() == 0:
            raise UsageError("the example input must have a batch dimension, got a scalar")
        return torch.empty((batch, *example.shape[1:]), dtype=example.dtype, device="meta",
                           requires_grad=example.requires_grad)
    if isinstance(example, int):
        example = (example,)
    if not (isinstance(example, (tuple, list, torch.Size)) and all(isinstance(d, int) and d > 0 for d in example)):
        raise UsageError(f"the example input must be a tensor or a shape of positive whole numbers, got {example!r}")
    return torch.empty((batch, *example), device="meta")


def _layers(charges: list[Charges]) -> tuple[LayerSpec, ...]:
    seen: set[int] = set()
    layers = []
    for c in charges:
        prefix = f"{c.name}." if c.name else ""
        owned = [(prefix + n, p) for n, p in c.module.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in owned)
        layers.append(LayerSpec(
            name=c.name or "(model)", kind=_kind(c), module=type(c.module).__name__, calls=c.calls,
            parameters=sum(p.numel() for _, p in owned),
            parameter_bytes=sum(p.numel() * p.element_size() for _, p in owned),
            parameter_shapes=tuple((n, tuple(p.shape)) for n, p in owned),
            forward_flops=c.forward_flops, backward_flops=c.backward_flops, gemms=tuple(c.gemms),
            input_elements=c.input_elements, output_elements=c.output_elements,
            forward_bytes=c.forward_bytes, backward_bytes=c.backward_bytes,
            forward_vector_bytes=c.forward_vector_bytes, backward_vector_bytes=c.backward_vector_bytes,
            forward_float32_bytes=c.forward_float32_bytes, backward_float32_bytes=c.backward_float32_bytes,
            frozen=tuple(n for n, p in owned if not p.requires_grad)))
    return tuple(layers)


def _gemm(fields: dict) -> Gemm:
    """A :class:`Gemm` from its JSON object (lists back to tuples; descriptions written before gpurig recorded a
    convolution's kernel and stride have neither).

    >>> _gemm({"m": 8, "n": 4, "k": 27, "count": 1, "kernel": [3, 3], "stride": [1, 1]}).kernel
    (3, 3)
    """
    return Gemm(**{**fields, **{name: tuple(fields[name]) for name in ("kernel", "stride") if name in fields}})


def _kind(charges: Charges) -> str:
    """The GEMM kind with the most FLOPs; else embedding or norm by the operators run; pool or activation by the
    module; else other."""
    if charges.gemm_flops:
        return max(charges.gemm_flops.items(), key=lambda item: item[1])[0]
    if aten.embedding in charges.ops or isinstance(charges.module, (nn.Embedding, nn.EmbeddingBag)):
        return "embedding"
    if charges.ops & NORM_OPS or "Norm" in type(charges.module).__name__:
        return "norm"
    if "Pool" in type(charges.module).__name__:
        return "pool"
    if type(charges.module).__module__ == nn.ReLU.__module__:  # torch.nn's activations: ReLU, GELU, Softmax, ...
        return "activation"
    return "other"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

