"""Every module's docstring examples run, in this process (one rank where an example needs a communicator).

The modules are found by walking the package, so a new module's examples are
checked without being listed anywhere; examples that need a real job say
``# doctest: +SKIP``.
"""

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import gpurig

MODULES = sorted(["gpurig", *(m.name for m in pkgutil.walk_packages(gpurig.__path__, "gpurig."))])
# Entry points whose import runs a command (``python -m ...``); they hold no examples.
NOT_IMPORTED = {"gpurig.__main__", "gpurig.train.__main__"}
# Modules that exist only with an optional library (imported where it is installed, e.g. on a GPU machine).
NEEDS = {"gpurig.parallel.native._triton_kernels": "triton"}


@pytest.mark.parametrize("name", [m for m in MODULES if m not in NOT_IMPORTED])
def test_docstring_examples(name):
    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(reason=f"needs {NEEDS[name]}, not installed here")
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"gpurig": gpurig}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
