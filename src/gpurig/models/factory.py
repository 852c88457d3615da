"""Load a user's model from ``module:factory`` and read a per-sample input shape such as ``3x224x224``.

Every failure is one line naming what was asked for and what went wrong.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

import torch
from torch import nn

from gpurig.errors import UsageError, one_line

DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
          "bfloat16": torch.bfloat16, "int64": torch.int64, "long": torch.int64, "int32": torch.int32}


class Placed(torch.overrides.TorchFunctionMode):
    """Every tensor the user's code places (``.cuda()``, ``.to("cuda:1")``, ``device="cuda"``), in its factory or
    its forward, lands on ``device`` instead: a model is described where no GPU is, from its layers' shapes alone.

    >>> with Placed("meta"):
    ...     torch.ones(2, device="cuda").device
    device(type='meta')
    """

    def __init__(self, device: str):
        super().__init__()
        self.device = torch.device(device)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.cuda, torch.Tensor.cpu):
            return args[0]
        if kwargs.get("device") is not None:
            kwargs["device"] = self.device
        if func is torch.Tensor.to and len(args) > 1:  # .to(device[, dtype]), .to(other_tensor): its dtype, here
            first, rest = args[1], list(args[2:])
            if isinstance(first, torch.Tensor):
                kwargs.update(device=self.device, dtype=kwargs.get("dtype") or first.dtype)
            elif isinstance(first, (str, int, torch.device)):
                kwargs["device"] = self.device
                if rest and isinstance(rest[0], torch.dtype):
                    kwargs["dtype"] = rest.pop(0)
            else:
                return func(*args, **kwargs)   # .to(dtype, ...): nothing placed
            kwargs.update(zip(("non_blocking", "copy"), rest))
            return func(args[0], **kwargs)
        return func(*args, **kwargs)


def load_factory(target: str, device: str | None = "meta") -> nn.Module:
    """Import ``module:factory`` (or ``path/to/file.py:factory``), call the factory, return its module.

    The factory is called with no arguments inside ``with torch.device("meta")``,
    so the layers it creates hold no memory; a factory that loads weights or
    names a device still works (:func:`gpurig.models.describe.describe` copies the
    module to the meta device without its weights). ``device=None`` builds it
    as the factory does (real weights, to train). The current directory is
    searched first, as ``python -m`` does.

    >>> type(load_factory("gpurig.models:mlp")).__name__
    'Sequential'
    >>> load_factory("gpurig.models:mpl")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: gpurig.models:mpl: module 'gpurig.models' has no attribute 'mpl' (closest: mlp)
    """
    if device != "meta":
        return _build(target, device)
    key = (target, os.getcwd())   # a factory's side effects (prints, downloads, a slow build) once per process
    model = _BUILT.pop(key, None)
    if model is None:
        model = _build(target, device)
    try:
        _BUILT[key] = copy.deepcopy(model)   # kept untouched for the next question
    except Exception:  # noqa: BLE001 (a module deepcopy cannot copy is built again next time)
        pass
    return model


def _build(target: str, device: str | None) -> nn.Module:
    """Call ``target``'s factory under ``device`` (and its placements on it); one line if it fails."""
    factory = find_function(target, "builds a model")
    try:
        with torch.device(device) if device is not None else contextlib.nullcontext(), \
                Placed(device) if device is not None else contextlib.nullcontext():
            model = factory()
    except Exception as error:  # the user's code: any failure is reported, in one line
        raise UsageError(f"{target}: the factory raised {one_line(error)}") from None
    except SystemExit as done:  # its module's own command line, say: not this process's exit
        raise UsageError(f"{target}: the factory called sys.exit({done.code!r})") from None
    if not isinstance(model, nn.Module):
        raise UsageError(f"{target}: the factory returned a {type(model).__name__}, not a torch.nn.Module")
    return model


_BUILT: dict[tuple[str, str], nn.Module] = {}   # meta modules by (module:factory, directory): no memory held


def find_function(target: str, does: str = "builds a model", example: str = "module:factory, such as "
                  "mypackage.models:build or models.py:build"):
    """The function (or class) ``module:name`` or ``path/to/file.py:name`` names, imported; one line if there is none.

    >>> find_function("gpurig.models:mlp").__name__
    'mlp'
    >>> find_function("gpurig.models", "loads data", "module:loader, such as mypackage.data:load")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: 'gpurig.models': expected module:loader, such as mypackage.data:load
    """
    module_name, _, attribute = target.partition(":")
    if not module_name.strip() or not attribute.strip():
        raise UsageError(f"{target!r}: expected {example}")
    found = _import(module_name.strip(), target)
    for part in attribute.strip().split("."):
        if not hasattr(found, part):
            close = difflib.get_close_matches(part, [n for n in dir(found) if not n.startswith("_")], n=3)
            hint = f" (closest: {', '.join(close)})" if close else ""
            raise UsageError(f"{target}: {_what(found)} has no attribute {part!r}{hint}")
        found = getattr(found, part)
    if not callable(found):
        raise UsageError(f"{target}: is a {type(found).__name__}, not a function or class that {does}")
    return found


def _import(name: str, target: str):
    """The module ``name`` (a dotted name, or a path ending in .py), imported with the current directory on the path."""
    try:
        if name.endswith(".py"):
            path = Path(name)
            if not path.is_file():
                raise UsageError(f"{target}: no file {name}")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        local = Path(os.getcwd()) / f"{name}.py"
        loaded = sys.modules.get(name)
        if local.is_file() and loaded is not None and Path(getattr(loaded, "__file__", "") or "") != local:
            return _import(str(local), target)   # json.py here, not the json gpurig imported: the directory first
        sys.path.insert(0, os.getcwd())
        try:
            return importlib.import_module(name)
        finally:
            sys.path.remove(os.getcwd())
    except UsageError:
        raise
    except Exception as error:  # ImportError, or whatever the module's own code raises on import
        raise UsageError(f"{target}: cannot import {name!r}: {one_line(error)}") from None
    except SystemExit as done:  # a training script that parses its command line on import
        raise UsageError(f"{target}: importing {name!r} called sys.exit({done.code!r}) (a script that runs on "
                         "import? put the model in a module, or guard the script with if __name__ == '__main__')") from None


def _what(obj) -> str:
    return f"module {obj.__name__!r}" if isinstance(obj, type(sys)) else repr(obj)[:60]


def parse_sample(text: str) -> tuple[tuple[int, ...], torch.dtype]:
    """A per-sample input written as ``3x224x224`` (float32) or ``128:int64`` (token ids): (shape, dtype).

    >>> parse_sample("3x224x224"), parse_sample("128:int64")
    (((3, 224, 224), torch.float32), ((128,), torch.int64))
    >>> parse_sample("3x224x")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: input shape '3x224x': expected sizes joined by x, such as 3x224x224 or 128:int64
    """
    shape_text, _, dtype_text = text.strip().partition(":")
    parts = shape_text.lower().replace("×", "x").split("x")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"input shape {text!r}: expected sizes joined by x, such as 3x224x224 or 128:int64")
    dtype_name = dtype_text.strip().lower() or "float32"
    if dtype_name not in DTYPES:
        raise UsageError(f"input shape {text!r}: unknown type {dtype_name!r}; use one of {', '.join(DTYPES)}")
    return tuple(int(p) for p in parts), DTYPES[dtype_name]


def sample_batch(text: str, batch: int = 1) -> torch.Tensor:
    """``batch`` samples of the input :func:`parse_sample` reads, as a meta tensor (shapes only).

    >>> sample_batch("3x224x224", 8).shape, sample_batch("128:int64").dtype
    (torch.Size([8, 3, 224, 224]), torch.int64)
    """
    shape, dtype = parse_sample(text)
    return torch.empty((batch, *shape), dtype=dtype, device="meta")
