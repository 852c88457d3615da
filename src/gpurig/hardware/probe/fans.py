"""Whether this machine lets software set its GPUs' fans: the X server's ``Coolbits`` option (the guide's way on
Linux), or NVML's fan control (driver 520 and later, as root, no X server needed)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

XORG_FILES = ("/etc/X11/xorg.conf", "/etc/X11/xorg.conf.d", "/usr/share/X11/xorg.conf.d")
FAN_BIT = 4   # Coolbits value 4: manual fan control (nvidia-xconfig --cool-bits=4)
_COOLBITS = re.compile(r'^\s*Option\s+"Coolbits"\s+"(\d+)"', re.I | re.M)


def coolbits(texts: list[str]) -> int | None:
    """The largest ``Coolbits`` value set in these X configuration files' texts (None: not set).

    >>> coolbits(['Section "Device"\\n    Option "Coolbits" "28"\\nEndSection'])
    28
    >>> coolbits(['# Option "Coolbits" "4"']) is None
    True
    """
    values = [int(v) for text in texts for v in _COOLBITS.findall(text)]
    return max(values) if values else None


def _config_texts(roots=XORG_FILES) -> tuple[list[str], list[str]]:
    texts, files = [], []
    for root in map(Path, roots):
        paths = sorted(root.glob("*.conf")) if root.is_dir() else [root] if root.is_file() else []
        for path in paths:
            try:
                texts.append(path.read_text(errors="replace"))
                files.append(str(path))
            except OSError:
                continue
    return texts, files


def fan_control(roots=XORG_FILES) -> dict:
    """``{"coolbits": int | None, "fan_control": bool, "files": [...], "nvidia_settings": bool}``.

    >>> isinstance(fan_control()["fan_control"], bool)
    True
    """
    texts, files = _config_texts(roots)
    bits = coolbits(texts)
    return {"coolbits": bits, "fan_control": bool(bits is not None and bits & FAN_BIT), "files": files,
            "nvidia_settings": shutil.which("nvidia-settings") is not None}
