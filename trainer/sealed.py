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
import os
from pathlib import Path

from runwatch.files import write_atomic

_HEADER = "runwatch sealed drill answer: open it with `runwatch diagnose`, not by hand\n"


def seal(path: Path, answer: dict) -> None:
    body = base64.b64encode(json.dumps(answer, sort_keys=True)[::-1].encode()).decode()
    write_atomic(Path(path), _HEADER + body + "\n")
    os.chmod(path, 0o600)


def unseal(path: Path) -> dict:
    text = Path(path).read_text()
    if not text.startswith(_HEADER):
        raise ValueError(f"{path}: not a sealed drill answer")
    return json.loads(base64.b64decode(text[len(_HEADER) :].strip()).decode()[::-1])
