"""The supervisor of ``pointsman serve --workers N``: uvicorn's, except for a replacement that fails to start.

uvicorn restarts a worker that dies, but when a worker fails to start (exit code ``STARTUP_FAILURE``: the
app's startup raised) it stops the whole service, survivors included, taking the app for broken. For
``pointsman serve`` a replacement worker fails to start when a file it reads at start is broken on disk: a
bad policy, fleet or budgets file that the running workers rejected and keep serving without (docs/service.md,
Live changes). A worker killed then (the OOM killer, a crash) turned that rejected reload into an outage.
Here only a worker of the first start that fails to start stops the service (``serve`` checked the files
before: such a failure is not a file fixed in between); a replacement that fails is logged and started again
every ``RETRY_S`` seconds, while the other workers serve, until one starts (the file fixed)."""

from __future__ import annotations

import logging
import time

from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

logger = logging.getLogger("uvicorn.error")

#: Seconds between a replacement worker's failed start and the next try (a start loads the estimator:
#: seconds of CPU, so not every 0.5 s).
RETRY_S = 5.0


class Supervisor(Multiprocess):
    """``Multiprocess`` (uvicorn's ``--workers``) retrying replacement workers that fail to start."""

    def init_processes(self) -> None:
        super().init_processes()
        self._first = set(map(id, self.processes))
        self._retry_at: dict[int, float] = {}

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        for idx, process in enumerate(self.processes):
            if idx in self._retry_at:
                if time.monotonic() < self._retry_at[idx]:
                    continue
                del self._retry_at[idx]
            elif process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            else:
                process.kill()  # hung: kill it
                process.join()
                if process.exitcode == STARTUP_FAILURE:
                    if id(process) in self._first:
                        logger.error(f"Child process [{process.process.pid}] failed to start, stopping the parent process.")
                        self.should_exit.set()
                        return
                    logger.error(f"Replacement worker [{process.process.pid}] failed to start (above); the other "
                                 f"workers serve on; starting another in {RETRY_S:g} s")
                    self._retry_at[idx] = time.monotonic() + RETRY_S
                    continue
                if self.should_exit.is_set():
                    return
                logger.warning(f"Child process [{process.process.pid}] died; starting a replacement")
            replacement = Process(self.config, self.sockets)
            replacement.start()
            self.processes[idx] = replacement
