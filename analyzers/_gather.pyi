"""Types of the C fold (``_gather.c``): the signature of its Python twin, ``gather_py.gather``."""

from collections.abc import Sequence
from typing import Any

def gather(out: Any, seq: Sequence[Any], idx: Any, attrs: tuple[str, ...], kind: str,
           arg: Any = None) -> None: ...
