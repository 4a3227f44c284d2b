"""One exception hierarchy; every message says what went wrong and how to fix it."""

from __future__ import annotations


class ReleaseError(Exception):
    """Base class of every error the pipeline raises on purpose."""

    hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        if hint is not None:
            self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return f"{self.message}\n  how to fix: {self.hint}" if self.hint else self.message

    def one_line(self) -> str:
        """What is wrong and how to fix it, on one line (the CLI's error output)."""
        text = " ".join(self.message.split())
        return f"{text} (how to fix: {' '.join(self.hint.split())})" if self.hint else text


def one_line(exc: BaseException) -> str:
    """An input error as one line: the project's errors with their hint, pydantic's
    validation errors field by field (without the rejected input, which may be a secret)."""
    if isinstance(exc, ReleaseError):
        return exc.one_line()
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            parts = [
                f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in errors()
            ]
        except (TypeError, KeyError):
            parts = []
        if parts:
            return "invalid input: " + " ".join("; ".join(parts).split())
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


class ConfigError(ReleaseError):
    """Invalid configuration or parameters, detected before any expensive work."""


class AcquireError(ReleaseError):
    """The model could not be downloaded or its bytes do not match the hub."""


class IntegrityError(AcquireError):
    """A file's hash or size differs from what the hub published."""


class QuantizeError(ReleaseError):
    """llm-compressor failed or produced an artifact that breaks the contract."""


class ServeError(ReleaseError):
    """A vLLM server did not become healthy; carries the log tail and a likely cause."""

    def __init__(self, message: str, *, log_tail: str = "", hint: str | None = None) -> None:
        self.log_tail = log_tail
        super().__init__(message, hint=hint)

    def __str__(self) -> str:
        text = super().__str__()
        if self.log_tail:
            text += "\n  --- server log tail ---\n" + self.log_tail
        return text


class EvalError(ReleaseError):
    """The evaluation harness failed or an eval set is invalid."""


class LoadTestError(ReleaseError):
    """The load generator failed or produced no usable measurement."""


class RouterError(ReleaseError):
    """HAProxy could not be started, configured or reached."""


class StateError(ReleaseError):
    """The release state is missing or inconsistent with the request."""


class MetricsError(ReleaseError):
    """Prometheus could not be started, reached or configured, or a query failed."""


class AlertRulesError(MetricsError):
    """An alert rule file was rejected by promtool or by Prometheus."""


class AlertmanagerError(MetricsError):
    """Alertmanager could not be started, or its config was refused by amtool or by it."""


class TrafficError(ConfigError):
    """Demo traffic refused before anything was sent: a target off this machine, bad rates."""


class DiskSpaceError(ReleaseError):
    """A download or quantization would not fit the free space of its target folder:
    refused before the first byte is written."""


class PublishError(ReleaseError):
    """A release could not be published to the hub, or the hub lists other bytes than the
    ones sent."""


class PrefectServerError(ReleaseError):
    """The project's Prefect server (``python -m flows.server``) did not become healthy."""
