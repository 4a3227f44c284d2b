"""Stages of a flow, named and timed: ``with stage("measure"): ...`` logs the stage's start
and its seconds in the run's log, and records them for the report (in order); a stage that
raises is recorded as the one that failed, with the seconds it ran, and the error goes on."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prefect.exceptions import MissingContextError
from prefect.logging import get_logger, get_run_logger


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:  # called outside a flow run (a test, a script)
        return get_logger("stage")


class StageClock:
    """The stages of one run: ``seconds`` (stage → seconds, in the order they ran) and
    ``failed`` (the stage that raised, if one did)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds: dict[str, float] = {}
        self.failed: str | None = None
        self._clock = clock

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        logger = _logger()
        logger.info("stage %s", name)
        started = self._clock()
        try:
            yield
        except BaseException:
            self.seconds[name] = round(self._clock() - started, 1)
            self.failed = name
            logger.error("stage %s failed after %.1f s", name, self.seconds[name])
            raise
        self.seconds[name] = round(self._clock() - started, 1)
        logger.info("stage %s done in %.1f s", name, self.seconds[name])
