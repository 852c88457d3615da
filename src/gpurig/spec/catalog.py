"""The catalog: GPUs, PCIe generations, GPU links and networks from the data files in ``spec/data/``.

Each file is CSV with a ``source`` column (a vendor datasheet, whitepaper or
standard); ``spec/data/README.md`` says where the numbers come from and how
they were checked. Names are looked up loosely: case, spaces, dashes and the
brand words (NVIDIA, GeForce, Tesla, AMD, Radeon, Instinct, RTX, GTX, RX) do
not matter, nor does word order, so "2080ti", "RTX 2080 Ti" and
"NVIDIA GeForce RTX 2080 Ti" find the same card. An unknown name is refused in
one line naming the closest matches.
"""

from __future__ import annotations

import csv
import difflib
import functools
import io
import re
import unicodedata
from importlib import resources

from gpurig.spec.fields import SpecError, from_mapping
from gpurig.spec.hardware import CATALOG_REQUIRED, GPU, GPULink, Network, PCIeGeneration

DATA = "gpurig.spec.data"
_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "ati", "radeon", "instinct"}
_SERIES_WORDS = {"rtx", "gtx", "rx"}
# Names two cards answer to, one of them an older generation's: asked which, not resolved to the older
# (a buyer who writes "RTX 6000" today most likely means the Ada card; Lambda's tables mean the Quadro).
_TWO_CARDS = {"RTX 6000": ("Quadro RTX 6000", "RTX 6000 Ada")}


def read_table(filename: str, cls, text_of: str | None = None) -> list:
    """Rows of data file ``filename`` (or of ``text_of``, CSV text) as ``cls`` instances, every field checked.

    >>> read_table("x.csv", PCIeGeneration, text_of="generation,year,gigatransfers_per_s,line_code,source\\n"
    ...            "3.0,2010,8,128b/130b,PCI-SIG\\n")[0].gigatransfers_per_s
    8.0
    """
    content = text_of if text_of is not None else resources.files(DATA).joinpath(filename).read_text()
    reader = csv.DictReader(io.StringIO(content))
    rows = []
    for line, row in enumerate(reader, start=2):
        if None in row or any(value is None for value in row.values()):
            raise SpecError(f"{filename} line {line}: {len(reader.fieldnames)} columns expected")
        label = row.get("name") or row.get("generation") or "?"
        rows.append(from_mapping(cls, row, f"{filename} line {line} ({label})", from_text=True))
    return rows


def name_key(name: str, drop: set[str] = frozenset()) -> str:
    """A name reduced for loose matching: lower case, letters and digits split, ``drop`` words removed, sorted.

    >>> name_key("GeForce RTX 2080 Ti", _VENDOR_WORDS | _SERIES_WORDS) == name_key("2080ti", _VENDOR_WORDS | _SERIES_WORDS)
    True
    """
    return " ".join(sorted(_words(name, drop)))


# Letters of other scripts drawn as Latin ones, as a name pasted from a web page or typed on another keyboard has
# them ("А100" with a Cyrillic А): read as the Latin letter they look like. Full-width forms ("Ａ１００") NFKC folds.
_LOOKALIKES = str.maketrans("АВЕКМНОРСТХаеорсухіІΑΒΕΗΙΚΜΝΟΡΤΥΧΖ", "ABEKMHOPCTXaeopcyxiIABEHIKMNOPTYXZ")


def latin(name: str) -> str:
    """``name`` with full-width forms folded (NFKC) and Cyrillic and Greek letters that look Latin made Latin.

    >>> latin("А100"), latin("Ａ１００ ＳＸＭ")
    ('A100', 'A100 SXM')
    """
    return unicodedata.normalize("NFKC", name).translate(_LOOKALIKES)


def _words(name: str, drop=frozenset()) -> list[str]:
    """``name``'s words in order, lower case, letters and digits split, ``drop`` words removed."""
    return [w for w in re.findall(r"[a-z]+|[0-9]+(?:\.[0-9]+)?", latin(name).lower()) if w not in drop]


class Lookup:
    """Find catalog entries by loose name; one-line errors for unknown or ambiguous names.

    Tries, in order: the exact name or an alias; the name without vendor words;
    without vendor and series words. The first level with a match decides.
    """

    LEVELS = (frozenset(), frozenset(_VENDOR_WORDS), frozenset(_VENDOR_WORDS | _SERIES_WORDS))

    def __init__(self, entries: list, what: str):
        self.entries, self.what = entries, what
        self.index: list[dict[str, list]] = [{} for _ in self.LEVELS]
        for entry in entries:
            names = [entry.name] + [a for a in (getattr(entry, "aliases", None) or "").split(";") if a.strip()]
            for level, drop in enumerate(self.LEVELS):
                for key in {name_key(n, drop) for n in names}:
                    bucket = self.index[level].setdefault(key, [])
                    if entry not in bucket:
                        bucket.append(entry)

    def find(self, name: str):
        """The one entry ``name`` means, or :class:`SpecError` with the closest names. A GPU's memory may be named
        with it, as nvidia-smi and shops do ("Tesla P100-SXM2-16GB", "RTX 3090 24 GB"): it picks among the
        entries the rest of the name means."""
        for plain, cards in _TWO_CARDS.items():
            if name_key(name, self.LEVELS[-1]) == name_key(plain, self.LEVELS[-1]) and \
                    name_key(name) != name_key(cards[0]) and all(any(e.name == c for e in self.entries) for c in cards):
                raise SpecError(f"{self.what} {name!r} is ambiguous: {', '.join(cards)}")
        found = self._matches(name)
        if len(found) == 1:
            return found[0]
        sized = _MEMORY.search(latin(name))
        if sized:
            rest = _MEMORY.sub(" ", latin(name)).strip(" -_")
            fitting = [e for e in self._matches(rest) if abs((getattr(e, "memory_gb", None) or 0) - float(sized[1])) < 1]
            if len(fitting) == 1:
                return fitting[0]
        if found:   # "a100 sxm": the start of several names, not a name
            raise SpecError(f"{self.what} {name!r} is ambiguous: {', '.join(e.name for e in found)}")
        raise SpecError(f"unknown {self.what} {name!r}{self.closest_hint(name)}")

    def _matches(self, name: str) -> list:
        """The entries ``name`` names at the first level with any; else those whose names it begins (up to 6; a
        number is whole: "H20" does not begin "H200")."""
        for level, drop in enumerate(self.LEVELS):
            found = self.index[level].get(name_key(name, drop), [])
            if found:
                return found
        words = name_key(name, self.LEVELS[-1]).split()
        begun = list(dict.fromkeys(e for k, entries in self.index[-1].items() for e in entries
                                   if words and all(any(w == x or len(x) > 1 and x.isalpha() and w.startswith(x)
                                                        for w in k.split())
                                                    for x in words)))
        return begun if 1 < len(begun) <= 6 else []

    def closest_hint(self, name: str) -> str:
        """"; closest: A, B, C": the names most alike, compared with the brand words dropped, both as written
        ("v100s" is nearly "V100") and with their words sorted ("A6000 Ada" is "RTX 6000 Ada")."""
        def alike(entry) -> float:
            names = [entry.name] + [a for a in (getattr(entry, "aliases", None) or "").split(";") if a.strip()]
            return max(difflib.SequenceMatcher(None, form(name), form(other)).ratio()
                       for other in names for form in (_compact, lambda text: name_key(text, self.LEVELS[-1])))

        scored = sorted(((alike(e), i, e.name) for i, e in enumerate(self.entries)), key=lambda t: (-t[0], t[1]))
        best = scored[0][0] if scored else 0.0
        close = [n for score, _, n in scored[:3] if score >= max(0.4, best - 0.15)]   # not the also-rans
        return f"; closest: {', '.join(close)}" if close else ""


_MEMORY = re.compile(r"[\s_-]*\b(\d+)\s*gb\b", re.I)


def _compact(name: str) -> str:
    """``name`` in lower case, its letters and digits run together, brand words dropped.

    >>> _compact("NVIDIA Tesla V100-SXM2")
    'v100sxm2'
    """
    return "".join(_words(name, _VENDOR_WORDS | _SERIES_WORDS))


@functools.cache
def gpus() -> tuple[GPU, ...]:
    """Every GPU in the catalog.

    >>> len(gpus()) > 50
    True
    """
    rows = read_table("gpus.csv", GPU)
    for line, row in enumerate(rows, start=2):
        missing = [f for f in CATALOG_REQUIRED if getattr(row, f) is None]
        if missing:
            raise SpecError(f"gpus.csv line {line} ({row.name}): {missing[0]}: missing (required in the catalog)")
    names = [row.name for row in rows]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(f"gpus.csv: {duplicates[0]!r} appears more than once")
    return tuple(rows)


@functools.cache
def pcie_generations() -> tuple[PCIeGeneration, ...]:
    """PCIe generations 1.0 to 6.0."""
    return tuple(read_table("pcie.csv", PCIeGeneration))


@functools.cache
def gpu_links() -> tuple[GPULink, ...]:
    """NVLink generations and AMD Infinity Fabric."""
    return tuple(read_table("gpu_links.csv", GPULink))


@functools.cache
def networks() -> tuple[Network, ...]:
    """Ethernet 1–400 GbE and InfiniBand SDR–XDR."""
    return tuple(read_table("networks.csv", Network))


@functools.cache
def _gpu_lookup() -> Lookup:
    return Lookup(list(gpus()), "GPU")


@functools.cache
def _network_lookup() -> Lookup:
    return Lookup(list(networks()), "network")


def gpu(name: str) -> GPU:
    """The catalog's GPU called ``name``, loosely.

    >>> gpu("2080ti").name, gpu("rtx2080 ti").name, gpu("NVIDIA GeForce RTX 2080 Ti").memory_gb
    ('GeForce RTX 2080 Ti', 'GeForce RTX 2080 Ti', 11.0)
    >>> gpu("RTX 2090")
    Traceback (most recent call last):
    ...
    gpurig.spec.fields.SpecError: unknown GPU 'RTX 2090'; closest: GeForce RTX 2060, GeForce RTX 2070, GeForce RTX 2080
    """
    return _gpu_lookup().find(name)


def knows_gpu(name: str) -> bool:
    """Whether :func:`gpu` finds ``name``.

    >>> knows_gpu("7900 XTX"), knows_gpu("XTX")
    (True, False)
    """
    try:
        gpu(name)
    except SpecError:
        return False
    return True


def network(name: str) -> Network:
    """The catalog's network called ``name`` ("FDR", "InfiniBand EDR", "10GbE" …).

    >>> network("FDR").data_gbit_per_s, network("10 GbE").gbit_per_s
    (54.5, 10.0)
    """
    return _network_lookup().find(name)


def pcie_generation(generation) -> PCIeGeneration:
    """PCIe generation ``generation`` ("3.0", "3", 3 or 3.0).

    >>> pcie_generation(3).gigatransfers_per_s
    8.0
    """
    wanted = str(generation).strip().lower().removeprefix("pcie").removeprefix("gen").strip()
    wanted = wanted if "." in wanted else f"{wanted}.0"
    for gen in pcie_generations():
        if gen.generation == wanted:
            return gen
    raise SpecError(f"unknown PCIe generation {generation!r}; known: "
                    f"{', '.join(g.generation for g in pcie_generations())}")


def gpu_link(name: str) -> GPULink:
    """The GPU-to-GPU link generation called ``name`` ("NVLink 3.0").

    >>> gpu_link("NVLink 3.0").max_links
    12
    """
    for link in gpu_links():
        if name_key(link.name) == name_key(name):
            return link
    raise SpecError(f"unknown GPU link {name!r}; known: {', '.join(link.name for link in gpu_links())}")
