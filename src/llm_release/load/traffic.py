"""Demo traffic: a bounded, steady stream of chat completions through the load balancer.

A demo has no users, so the canary's analysis window would judge a silent service. This
sends what an application would send — chat completions with the ``openai`` client, to
the load balancer's OpenAI API — at a steady rate, from a few background threads, and
stops at ``duration_s`` (or ``max_requests``, or ``stop()``), whichever comes first. It
only ever targets this machine: a base URL whose host is not 127.0.0.1, localhost or ::1
is refused before anything is sent.

The client does no retries of its own (``max_retries=0``): a request the load balancer
lost must show up as a failure here, not be hidden by a second try from the client.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from importlib import resources
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from llm_release.errors import TrafficError

# Host names that are this machine; "localhost" is sent as 127.0.0.1, so /etc/hosts
# cannot point the stream elsewhere.
LOOPBACK = {"127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1", "::1": "[::1]"}
MAX_RATE_RPS = 1000.0
MAX_DURATION_S = 24 * 3600.0
MAX_CONCURRENCY = 256
MAX_TOKENS = 4096
MAX_PROMPT_CHARS = 8000
DEFAULT_TIMEOUT_S = 60.0
# Seconds stop() waits past the request timeout before it closes the client under a
# thread that is still in a request (the close aborts it; the thread then exits).
JOIN_GRACE_S = 5.0


def local_base_url(url: str) -> str:
    """``url`` as the OpenAI client's base URL (``.../v1``), if it names this machine."""
    if not isinstance(url, str) or not url or any(c.isspace() or not c.isprintable() for c in url):
        raise TrafficError(
            f"invalid traffic URL {url!r}", hint="use http://127.0.0.1:PORT (the load balancer)"
        )
    parts = urlsplit(url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or host is None:
        raise TrafficError(
            f"invalid traffic URL {url!r}: expected http(s)://HOST:PORT",
            hint="use http://127.0.0.1:PORT (the load balancer)",
        )
    if host not in LOOPBACK:
        raise TrafficError(
            f"refusing to send demo traffic to {host!r}: only this machine is a target",
            hint="demo traffic goes to the local load balancer: http://127.0.0.1:PORT "
            "(or localhost, [::1])",
        )
    if parts.username is not None or parts.password is not None:
        raise TrafficError(
            "the traffic URL carries credentials", hint="pass the URL without user:password@"
        )
    try:
        port = parts.port
    except ValueError:
        raise TrafficError(
            f"invalid port in traffic URL {url!r}", hint="use http://127.0.0.1:PORT"
        ) from None
    if parts.query or parts.fragment:
        raise TrafficError(
            f"the traffic URL {url!r} has a query or fragment",
            hint="pass the base URL only, e.g. http://127.0.0.1:8080",
        )
    netloc = LOOPBACK[host] + (f":{port}" if port is not None else "")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, netloc, path, "", ""))


def load_prompts() -> list[str]:
    """The packaged demo prompts (``data/traffic_prompts.txt``), one per line."""
    text = resources.files("llm_release").joinpath("data/traffic_prompts.txt").read_text("utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


class TrafficReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str
    model: str
    rate_rps: float = Field(description="the rate asked for")
    concurrency: int
    sent: int
    succeeded: int
    failed: int
    errors: dict[str, int] = Field(
        default_factory=dict, description="failed requests by kind: http_<status>, timeout, …"
    )
    error_samples: dict[str, str] = Field(
        default_factory=dict, description="the first message of each error kind"
    )
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    latency_max_s: float | None = None
    output_tokens: int = 0
    achieved_rate_rps: float = Field(description="requests sent per second of the run")
    duration_s: float = Field(description="start of the stream to its last answer")
    stopped_early: bool = Field(False, description="stop() ended it before its bounds")

    @classmethod
    def from_samples(
        cls,
        *,
        base_url: str,
        model: str,
        rate_rps: float,
        concurrency: int,
        latencies_s: list[float],
        errors: dict[str, int],
        duration_s: float,
        error_samples: dict[str, str] | None = None,
        output_tokens: int = 0,
        stopped_early: bool = False,
    ) -> TrafficReport:
        """The report of a run: one latency per succeeded request, failures by kind."""
        failed = sum(errors.values())
        sent = len(latencies_s) + failed
        return cls(
            base_url=base_url,
            model=model,
            rate_rps=rate_rps,
            concurrency=concurrency,
            sent=sent,
            succeeded=len(latencies_s),
            failed=failed,
            errors=dict(sorted(errors.items())),
            error_samples=error_samples or {},
            # numpy's default (linear) interpolation between the closest ranks
            latency_p50_s=float(np.percentile(latencies_s, 50)) if latencies_s else None,
            latency_p95_s=float(np.percentile(latencies_s, 95)) if latencies_s else None,
            latency_max_s=max(latencies_s) if latencies_s else None,
            output_tokens=output_tokens,
            achieved_rate_rps=sent / duration_s if duration_s > 0 else 0.0,
            duration_s=duration_s,
            stopped_early=stopped_early,
        )

    def summary(self) -> str:
        lines = [
            f"traffic to {self.base_url} (model {self.model}): {self.sent} sent, "
            f"{self.succeeded} succeeded, {self.failed} failed in {self.duration_s:.1f} s "
            f"({self.achieved_rate_rps:.2f} req/s; asked {self.rate_rps:g}, concurrency "
            f"{self.concurrency})"
        ]
        if self.latency_p50_s is not None:
            lines.append(
                f"latency p50 {self.latency_p50_s:.3f} s, p95 {self.latency_p95_s:.3f} s, "
                f"max {self.latency_max_s:.3f} s"
            )
        for kind, count in self.errors.items():
            sample = self.error_samples.get(kind, "")
            lines.append(f"  {kind}: {count}" + (f" (first: {sample})" if sample else ""))
        return "\n".join(lines)


class EmptyCompletion(Exception):
    """A 200 answer without a choice: the application got nothing to show."""


def error_kind(exc: BaseException) -> str:
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    if isinstance(exc, openai.APIStatusError):
        return f"http_{exc.status_code}"
    if isinstance(exc, EmptyCompletion):
        return "empty_completion"
    return type(exc).__name__


def _number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TrafficError(f"{name} must be a number, got {value!r}", hint=f"pass {name} > 0")
    if not low < value <= high:
        raise TrafficError(
            f"{name} = {value:g} is out of range", hint=f"pass {name} in ({low:g}, {high:g}]"
        )
    return float(value)


def _count(name: str, value: object, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise TrafficError(f"{name} = {value!r} is out of range", hint=f"pass 1..{high}")
    return value


class Traffic:
    """A bounded, steady request stream; ``with Traffic(...) as t:`` or ``start()``/``stop()``.

    Requests are scheduled every ``1 / rate_rps`` seconds and sent by at most
    ``concurrency`` threads at once. When the service is slower than the rate, sends wait
    for a free thread and the schedule moves on from there (no burst to catch up later):
    the report's achieved rate then says what the service took.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        rate_rps: float,
        duration_s: float,
        concurrency: int = 4,
        max_tokens: int = 16,
        prompts: list[str] | None = None,
        seed: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_requests: int | None = None,
        request_body: dict | None = None,
        api_key: str | None = None,
    ) -> None:
        """``request_body``: fields every request carries besides the chat (the thinking
        switch of a reasoning model: ``reasoning.request_body``). ``api_key``: the load
        balancer's key (``Router.api_key``), sent as ``Authorization: Bearer``."""
        self.base_url = local_base_url(base_url)
        if not isinstance(model, str) or not model.strip() or len(model) > 256:
            raise TrafficError(
                f"invalid model name {model!r}", hint="pass the served model name (--model)"
            )
        self.model = model
        self.rate_rps = _number("rate_rps", rate_rps, 0, MAX_RATE_RPS)
        self.duration_s = _number("duration_s", duration_s, 0, MAX_DURATION_S)
        self.concurrency = _count("concurrency", concurrency, MAX_CONCURRENCY)
        self.max_tokens = _count("max_tokens", max_tokens, MAX_TOKENS)
        self.timeout_s = _number("timeout_s", timeout_s, 0, 3600)
        self.max_requests = (
            None if max_requests is None else _count("max_requests", max_requests, 10_000_000)
        )
        prompts = load_prompts() if prompts is None else list(prompts)
        if not prompts or not all(
            isinstance(p, str) and p.strip() and len(p) <= MAX_PROMPT_CHARS for p in prompts
        ):
            raise TrafficError(
                "prompts must be a non-empty list of non-empty strings",
                hint=f"each prompt at most {MAX_PROMPT_CHARS} characters",
            )
        self.prompts = prompts
        if request_body is not None and not isinstance(request_body, dict):
            raise TrafficError(
                f"request_body must be a dict, got {type(request_body).__name__}",
                hint="pass e.g. {'chat_template_kwargs': {'enable_thinking': False}}",
            )
        self.request_body = dict(request_body or {})
        if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
            raise TrafficError("api_key must be a non-empty string", hint="pass Router.api_key")
        self._api_key = api_key
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._client = None
        self._claimed = 0
        self._latencies: list[float] = []
        # (sent at, seconds since start; latency; error kind or None), one per request
        self._samples: list[tuple[float, float, str | None]] = []
        self._errors: Counter[str] = Counter()
        self._error_samples: dict[str, str] = {}
        self._output_tokens = 0
        self._t0 = 0.0
        self._next_at = 0.0
        self._end_at = 0.0
        self._last_done = 0.0
        self._report: TrafficReport | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Traffic:
        if self._threads or self._report is not None:
            raise TrafficError("this traffic stream was already started", hint="make a new one")
        import openai

        self._client = openai.OpenAI(
            base_url=self.base_url,
            # The load balancer's key when given; never the caller's OPENAI_API_KEY.
            api_key=self._api_key or "EMPTY",
            max_retries=0,
            timeout=self.timeout_s,
            # No proxy from the environment: the stream goes to this machine directly.
            http_client=openai.DefaultHttpxClient(trust_env=False),
        )
        self._t0 = self._next_at = self._last_done = time.monotonic()
        self._end_at = self._t0 + self.duration_s
        for index in range(self.concurrency):
            thread = threading.Thread(target=self._worker, name=f"traffic-{index}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the stream ran out (duration or max_requests); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in self._threads:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
            if thread.is_alive():
                return False
        return True

    def stop(self) -> TrafficReport:
        """Send nothing more, let the requests in flight finish, join every thread."""
        if self._report is not None:
            return self._report
        stopped_early = self.running()
        self._stop.set()
        deadline = time.monotonic() + self.timeout_s + JOIN_GRACE_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._client is not None:
            # Aborts any request still in flight past its timeout; its thread then exits.
            self._client.close()
        for thread in self._threads:
            thread.join(JOIN_GRACE_S)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:  # pragma: no cover - a request that ignores the closed client
            raise TrafficError(f"traffic threads did not stop: {', '.join(alive)}")
        self._report = self.report(stopped_early=stopped_early)
        return self._report

    def run(self) -> TrafficReport:
        """Start, wait for the bounds, stop (also on Ctrl-C)."""
        self.start()
        try:
            self.wait()
        finally:
            report = self.stop()
        return report

    def report(self, *, stopped_early: bool = False) -> TrafficReport:
        """The figures so far (the final ones once stopped)."""
        if self._report is not None:
            return self._report
        with self._lock:
            end = self._last_done if not self.running() else time.monotonic()
            return TrafficReport.from_samples(
                base_url=self.base_url,
                model=self.model,
                rate_rps=self.rate_rps,
                concurrency=self.concurrency,
                latencies_s=list(self._latencies),
                errors=dict(self._errors),
                error_samples=dict(self._error_samples),
                output_tokens=self._output_tokens,
                duration_s=max(0.0, end - self._t0),
                stopped_early=stopped_early,
            )

    def samples(self) -> list[tuple[float, float, str | None]]:
        """Every answered request: (sent at, seconds after start; latency s; error kind or
        None), in the order answered — to see what a moment of the run cost."""
        with self._lock:
            return list(self._samples)

    def answered(self) -> int:
        with self._lock:
            return len(self._samples)

    def __enter__(self) -> Traffic:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- the stream ----------------------------------------------------------------------------
    def _claim(self) -> tuple[float, str] | None:
        """The next send time and prompt, or None when the stream is over."""
        with self._lock:
            if self._stop.is_set():
                return None
            if self.max_requests is not None and self._claimed >= self.max_requests:
                return None
            due = max(self._next_at, time.monotonic())
            if due >= self._end_at:
                return None
            self._next_at = due + 1 / self.rate_rps
            self._claimed += 1
            return due, self.prompts[self._rng.randrange(len(self.prompts))]

    def _worker(self) -> None:
        while (claim := self._claim()) is not None:
            due, prompt = claim
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return  # stopped before this one was sent: it never was
            self._send(prompt)

    def _send(self, prompt: str) -> None:
        started = time.monotonic()
        try:
            response = self._client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=self.max_tokens,
                extra_body=self.request_body or None,
            )
            if not response.choices:
                raise EmptyCompletion("the answer had no choices")
        except Exception as exc:  # every failure is counted, none ends the stream
            kind = error_kind(exc)
            done = time.monotonic()
            with self._lock:
                self._errors[kind] += 1
                self._error_samples.setdefault(kind, " ".join(str(exc).split())[:200])
                self._samples.append((started - self._t0, done - started, kind))
                self._last_done = done
            return
        done = time.monotonic()
        tokens = response.usage.completion_tokens if response.usage else 0
        with self._lock:
            self._latencies.append(done - started)
            self._samples.append((started - self._t0, done - started, None))
            self._output_tokens += tokens or 0
            self._last_done = done
