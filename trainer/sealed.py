"""The drill's answer, sealed: written where the learner won't read it by accident.

Sealing is not encryption. It keeps the truth off /metrics, out of run.json and out of a
casual `cat`; `runwatch diagnose` opens it once the learner has committed to a diagnosis.

    >>> seal(Path("answer.sealed"), {"incident": "slow_node", "onset": 287})
    >>> unseal(Path("answer.sealed"))["incident"]
    'slow_node'
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from runwatch.core.files import write_atomic

_HEADER = "runwatch sealed drill answer: open it with `runwatch diagnose`, not by hand\n"


def seal_text(answer: dict) -> str:
    """The sealed form of an answer, as text (what seal() writes)."""
    return _HEADER + base64.b64encode(json.dumps(answer, sort_keys=True)[::-1].encode()).decode() + "\n"


def is_sealed(text: str) -> bool:
    return text.startswith(_HEADER)


def unseal_text(text: str, source: str = "sealed answer") -> dict:
    """The answer in seal_text()'s text; ValueError naming `source` if it is not one."""
    if not is_sealed(text):
        raise ValueError(f"{source}: not a sealed drill answer")
    try:
        answer = json.loads(base64.b64decode(text[len(_HEADER) :].strip()).decode()[::-1])
    except ValueError as err:
        raise ValueError(f"{source}: a damaged sealed drill answer ({err})") from None
    if not isinstance(answer, dict):
        raise ValueError(f"{source}: a damaged sealed drill answer (not an object)")
    return answer


def seal(path: Path, answer: dict) -> None:
    """Write the sealed answer to path, readable by its owner only."""
    write_atomic(Path(path), seal_text(answer), mode=0o600)


def unseal(path: Path) -> dict:
    return unseal_text(Path(path).read_text(), str(path))
