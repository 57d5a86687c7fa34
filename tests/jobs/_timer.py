"""The test jobs' own step timer: from the end of one step to the end of the next, as gpudiag's
step timer measures, so the tests compare like with like; written as ``step_seconds`` in the
job's ``--report`` JSON with whatever else the job knows (its FLOPs, its phases)."""

import json
import time


class OwnTimer:
    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._t = time.perf_counter()

    def lap(self) -> None:
        """A step ended now."""
        now = time.perf_counter()
        self.seconds.append(now - self._t)
        self._t = now

    def write(self, path: str, **extra: object) -> None:
        with open(path, "w") as f:
            json.dump({"step_seconds": self.seconds, **extra}, f)
