"""A drill's answer, drawn and sealed by `up` before its trainer starts: the trainer reads it
from the sealed file, never from its argv (runwatch.drill.answer)."""

from __future__ import annotations

import random
import secrets

from runwatch.core.files import write_atomic
from runwatch.drill.answer import seal_answer
from runwatch.lab.state import LabDir
from runwatch.trainer.config import TrainConfig, draw_drill


class Sealing(LabDir):
    """Seals a drill's incident in one of the lab's runs."""

    def seal_drill(
        self, run_id: str, drill_seed: int | None, seed: int = 0, ranks: int = 1, difficulty: str = "normal"
    ) -> None:
        """Draw the drill's incident and onset (and the rank a cluster incident strikes, for a run
        of `seed` over `ranks`) and seal them in the run's directory.

        With a seed the draw is reproducible in this state directory only: it is keyed by a
        secret of the lab's (drill.key, owner-only), so the seed on its own names nothing.
        """
        if drill_seed is None:
            rng: random.Random = secrets.SystemRandom()
        else:
            key_file = self.state / "drill.key"
            if not key_file.exists():
                write_atomic(key_file, secrets.token_hex(16) + "\n", mode=0o600)
            rng = random.Random(f"{key_file.read_text().strip()}:{drill_seed}")
        self.sealed_answer(run_id).parent.mkdir(parents=True, exist_ok=True)
        drawn = draw_drill(rng, cluster=ranks > 1, difficulty=difficulty)
        # the training seed is the drawn one, sealed with the answer: `seed` is not a drill's
        cfg = TrainConfig(incident=drawn["incident"], onset=drawn["onset"], seed=drawn["seed"], ranks=ranks,
                          run_id=run_id, strength=drawn.get("strength", 1.0))  # fmt: skip
        seal_answer(self.sealed_answer(run_id), cfg)
