"""What CUDA's autocast does to a forward pass's tensors, replayed on the meta device.

``torch.autocast`` does nothing to meta tensors, and a description is traced on
the meta device, so the tensors a mixed-precision step saves for backward are
not simply half of an FP32 step's. Autocast runs products (linear layers,
convolutions, matmuls, attention) in 16 bits, casting their inputs, but keeps
layer and group norms, softmax, the losses and reductions in FP32, and leaves
the rest in whatever type its inputs have: a transformer's residual stream
stays FP32 (an FP32 embedding plus a 16-bit branch is FP32), and every product
fed from it saves its own 16-bit copy of its input. A post-norm BERT layer saves
0.63x of its FP32 bytes, not 0.5x (a lent H100 measured 0.64x).

:class:`MetaAutocast` casts the arguments of those functions as CUDA's autocast
does (its ``lower_precision_fp`` and ``fp32`` lists, PyTorch's
``aten/src/ATen/autocast_mode.cpp``), one level above autograd, so autograd
saves the casts exactly as it does under ``torch.autocast("cuda")``. Casts of
weights are made once per weight and kept (autocast's cast cache): they are the
step's 16-bit weight copies, not activations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gpurig.models.inside import call_inside

Tensor = torch.Tensor

# autocast's lower_precision_fp list, as the Python functions that reach it
LOWER = {
    F.linear, F.bilinear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d,
    F.conv_transpose3d, F.prelu, F.scaled_dot_product_attention,
    torch.matmul, Tensor.matmul, Tensor.__matmul__, Tensor.__rmatmul__, torch.mm, Tensor.mm, torch.mv, Tensor.mv,
    torch.bmm, Tensor.bmm, torch.addmm, Tensor.addmm, torch.baddbmm, Tensor.baddbmm, torch.addbmm,
    Tensor.addbmm, torch.addmv, Tensor.addmv, torch.addr, torch.einsum, torch.chain_matmul, torch.linalg.multi_dot,
    torch.linalg.vecdot, torch.conv1d, torch.conv2d, torch.conv3d, torch.prelu,
}
# its fp32 and fp32_set_opt_dtype lists: norms, softmax, losses, transcendentals, reductions
FLOAT32 = {
    F.layer_norm, F.group_norm, F.softmax, F.log_softmax, F.softmin, F.softplus, F.normalize,
    F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.kl_div,
    F.binary_cross_entropy_with_logits, F.poisson_nll_loss, F.cosine_similarity, F.cosine_embedding_loss,
    F.margin_ranking_loss, F.hinge_embedding_loss, F.soft_margin_loss, F.multilabel_margin_loss,
    F.multi_margin_loss, F.triplet_margin_loss, F.interpolate, F.pdist,
    torch.layer_norm, torch.group_norm, torch.softmax, Tensor.softmax, torch.log_softmax, Tensor.log_softmax,
    torch.exp, Tensor.exp, torch.expm1, Tensor.expm1, torch.log, Tensor.log, torch.log2, Tensor.log2,
    torch.log10, Tensor.log10, torch.log1p, Tensor.log1p, torch.pow, Tensor.pow, Tensor.__pow__,
    torch.rsqrt, Tensor.rsqrt, torch.reciprocal, Tensor.reciprocal, torch.acos, torch.asin, torch.cosh,
    torch.sinh, torch.tan, torch.erfinv, torch.logsumexp, Tensor.logsumexp, torch.cumsum, Tensor.cumsum,
    torch.cumprod, Tensor.cumprod, torch.sum, Tensor.sum, torch.prod, Tensor.prod, torch.norm, Tensor.norm,
    torch.linalg.vector_norm, torch.linalg.matrix_norm, torch.cdist, torch.dist, torch.renorm,
}


class MetaAutocast(TorchFunctionMode):
    """CUDA autocast's casts, applied where ``torch.autocast`` cannot (meta tensors): ``with MetaAutocast():``.

    ``weight_casts`` holds the 16-bit copy of each weight made so far (leaf tensors that require grad).

    >>> with torch.device("meta"):
    ...     layer = torch.nn.Linear(8, 4)
    ...     with MetaAutocast(torch.bfloat16) as amp:
    ...         y = layer(torch.empty(2, 8))
    ...         z = torch.softmax(y, -1)
    >>> y.dtype, z.dtype, len(amp.weight_casts)
    (torch.bfloat16, torch.float32, 2)
    """

    def __init__(self, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.dtype = dtype
        self.weight_casts: dict[int, Tensor] = {}

    def _cast(self, value, dtype: torch.dtype):
        if isinstance(value, Tensor):
            if not value.is_floating_point() or value.dtype == dtype:
                return value
            if value.is_leaf and value.requires_grad:   # a weight: cast once, kept for the step
                cast = self.weight_casts.get(id(value))
                if cast is None or cast.dtype != dtype:
                    cast = self.weight_casts[id(value)] = value.to(dtype)
                return cast
            return value.to(dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(item, dtype) for item in value)
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dtype = self.dtype if func in LOWER else torch.float32 if func in FLOAT32 else None
        if dtype is None:   # nn.MultiheadAttention's projections and attention are inside a Python function
            return call_inside(self, func, args, kwargs)
        args = self._cast(args, dtype)
        kwargs = {key: self._cast(value, dtype) for key, value in kwargs.items()}
        return func(*args, **kwargs)
