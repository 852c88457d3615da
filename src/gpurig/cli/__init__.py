"""The ``gpurig`` command line: one module per verb (parse, call the verb, print), no logic.

:mod:`~gpurig.cli.parser` builds the whole command and dispatches; :mod:`~gpurig.cli.common`
holds the flags several verbs share. Nothing outside this package imports it.
"""

from gpurig.cli.parser import build_parser, main

__all__ = ["main", "build_parser"]
