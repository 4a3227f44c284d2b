"""Run one vLLM OpenAI-compatible server per candidate or release.

``Server`` is the endpoint contract (readiness, log tail and likely cause, stop); the
process backend (``VllmServer``, a process of the serving virtualenv) lives here, the
docker backend in ``backends/docker.py``. ``make_server`` picks one by
``serving.backend``; the rest of the pipeline never knows which one runs.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import requests

from llm_release import hardware, paths, server_key
from llm_release.config import ServingConfig
from llm_release.errors import ConfigError, ServeError
from llm_release.hub.credentials import child_env
from llm_release.serving import batch_invariance, gpus, processes, reasoning
from llm_release.serving.capacity import resolve_batch
from llm_release.serving.cpu_kernels import check_kv_cache
from llm_release.serving.dtype import served_dtype
from llm_release.serving.serving_flags import check_serving_args

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40

# The folder vLLM's --middleware imports the lock from (standard library only: the project
# is not installed in the serving virtualenv or image).
MIDDLEWARE_DIR = Path(__file__).resolve().with_name("vllm_middleware")

# A port picked here can still be taken before the server binds it (vLLM binds ~25 s after
# its start, once its imports are done; CI, 2026-12-02: "Address already in use" for a
# candidate while the other pytest worker started its own servers). A server whose port was
# picked, not given, is started again on a new pick; the docker daemon says it its own way.
# A port can also be bound first by another server while ours is still importing: /health
# then answers 200 for that one (CI, 2026-12-04: a release's first completion got the other
# worker's vLLM, "model `tiny-llama` does not exist"), so a healthy port must list our names.
PORT_TAKEN = re.compile(
    r"(?i)Address already in use|port is already allocated|answers for another server"
)
PORT_RETRIES = 2

# (pattern in the server log, what it most likely means)
LIKELY_CAUSES: list[tuple[re.Pattern[str], str]] = [
    (
        # vLLM CPU 0.32 asked for --kv-cache-dtype fp8 on an AVX2-only CPU (its worker:
        # "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.").
        re.compile(r"FP8 KV cache on CPU requires x86 with AVX-512 or AMX"),
        "this CPU lacks AVX-512/AMX, which vLLM's CPU fp8 KV cache needs: "
        "use kv_cache_dtype auto on this host",
    ),
    (
        # vLLM CPU 0.32's AVX2 library has no W4A16 kernel: healthy, then dead at request one.
        re.compile(r"'_OpNamespace' '_C' object has no attribute '\w+'|has no attribute 'cpu_\w+'"),
        "this vLLM build has no kernel for this quantization scheme on this processor",
    ),
    (
        # vLLM CPU 0.32 on a quantized Qwen3-MoE: "Unsupported FP8 MoE backend: NONE", "No
        # WNA16 MoE backend supports the deployment configuration".
        # (the backend's name, not the "{fp8_backend.value}" of the traceback's source line)
        re.compile(r"Unsupported \w+ MoE backend: [A-Z_]+|No [\w ]+ MoE backend supports[^\n]*"),
        "this vLLM build has no mixture-of-experts kernel for this quantization scheme here",
    ),
    (
        re.compile(r"(?i)out of memory|CUDA error: out of memory|Cannot allocate memory"),
        "out of memory: lower max-model-len / max-num-seqs, or the KV-cache size",
    ),
    (
        re.compile(
            r"(?i)No available memory for the cache blocks|KV cache.*(insufficient|larger)"
            r"|is larger than the maximum number of tokens that can be stored"
        ),
        "KV cache too small for max-model-len: raise the KV-cache size or lower max-model-len",
    ),
    (
        re.compile(
            r"(?i)error: unrecognized arguments|error: argument|invalid choice|"
            r"invalid (int|float) value"
        ),
        "bad vLLM arguments: check serving.extra_args and the other serving settings",
    ),
    (PORT_TAKEN, "the port is taken: pick another port"),
    (
        re.compile(r"(?i)No such file or directory.*config\.json|does not appear to have a file"),
        "the model directory is incomplete: re-run acquire/quantize",
    ),
]

NO_CAUSE = "see the log tail below"
ROOT_CAUSE_CHARS = 300

# The prefixes of a vLLM log line: the process ("(EngineCore_DP0 pid=123) ", "(Worker pid=9)",
# "(VllmWorker-0 pid=9)", "(APIServer pid=1)"; vLLM 0.32 puts it in its logger's format,
# older ones prefixed the process's whole output), then the logger's "ERROR 12-03 19:54:26
# [core.py:1510] ". Colours, where the output was a terminal, go first.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PROCESS = re.compile(r"^\s*\([\w.-]+[^()\n]*\bpid=\d+[^()\n]*\)\s*")
_LOGGER = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\s+(?:\[[^\]]*\]\s?)?"
)
# A line that names an exception, as Python prints a traceback's last line ("  | " inside an
# exception group): "NotImplementedError: ...", "torch.OutOfMemoryError: ...",
# "vllm.v1.engine.exceptions.EngineDeadError: ...", "KeyboardInterrupt".
_EXCEPTION = re.compile(
    r"^(?:\s*\|\s)?\s*(?P<name>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception|Interrupt|Exit))"
    r"(?::\s|$)"
)
# argparse's refusal ("api_server.py: error: unrecognized arguments: --x"), no traceback.
_ARGPARSE = re.compile(r"^[\w.-]+: error: ")
# What reports another process's failure, or the shutdown after it: never the root cause.
_WRAPPERS = re.compile(
    r"Engine core initialization failed|Frontend process failed during engine core"
    r"|See root cause above|see the stack trace above for the root cause"
    r"|please check the\s+stack trace above|See stack trace for root cause"
    r"|Failed core proc|EngineCore encountered an issue|EngineDeadError|EngineGenerateError"
    r"|^(?:KeyboardInterrupt|SystemExit|GeneratorExit|BrokenPipeError|ConnectionResetError"
    r"|(?:asyncio\.(?:exceptions\.)?)?CancelledError)\b"
)


def root_cause(log_text: str) -> str | None:
    """The first line of the log that names the exception the engine died of, whichever of
    vLLM's processes printed it, without its prefixes and cut to ``ROOT_CAUSE_CHARS``.

    vLLM's API server ends its log with "Engine core initialization failed. See root cause
    above", the engine's (or its worker's) own traceback sits tens of lines higher: the
    first exception line that is not such a wrapper is the root cause. Lines logged below
    ERROR (a WARNING quoting an exception it survived) are not."""
    for raw in log_text.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        line = _PROCESS.sub("", line, count=1)
        logged = _LOGGER.match(line)
        if logged and logged.group("level") not in ("ERROR", "CRITICAL"):
            continue
        message = line[logged.end() :] if logged else line
        if not (_EXCEPTION.match(message) or _ARGPARSE.match(message)):
            continue
        message = re.sub(r"^\s*\|\s", "", message).strip()
        if _WRAPPERS.search(message):
            continue
        if len(message) > ROOT_CAUSE_CHARS:
            message = message[: ROOT_CAUSE_CHARS - 4].rstrip() + " ..."
        return message
    return None


def _match_cause(log_text: str, root: str | None) -> tuple[str, str] | None:
    """(likely cause, the text that shows it): read in the root-cause line first, so that a
    pattern matching some other line of the log does not name the wrong cause."""
    for text in (root, log_text):
        if not text:
            continue
        for pattern, cause in LIKELY_CAUSES:
            match = pattern.search(text)
            if match:
                return cause, match.group(0)
    return None


def likely_cause(log_text: str) -> str:
    found = _match_cause(log_text, root_cause(log_text))
    return found[0] if found else NO_CAUSE


def diagnose(log_text: str) -> str:
    """The likely cause, with the log line that shows it (it is often far above the tail):
    the root-cause line (``root_cause``) where there is one."""
    root = root_cause(log_text)
    found = _match_cause(log_text, root)
    if found is None:
        return f"the engine's first error: {root!r}" if root else NO_CAUSE
    cause, evidence = found
    if root is None:
        return f"{cause} (log: {evidence!r})"
    if evidence in root:
        return f"{cause} (log: {root!r})"
    return f"{cause} (log: {evidence!r}; first error: {root!r})"


# Ports for servers started later are picked below the kernel's ephemeral range: a port
# from inside it can be taken, between the pick and the server's bind, by the local end of
# any outgoing connection (CI, 2026-12-01: a Prometheus could not bind the port picked for
# it 80 s earlier, "address already in use", while the other pytest worker ran a load test).
PORT_FLOOR = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    # The wildcard address: also refused when a server holds the port on 127.0.0.1 only.
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port(*, attempts: int = 64) -> int:
    """A port free now, below the ephemeral range where it has one of at least 1,000 ports;
    else (or when ``attempts`` random picks are all taken) one the kernel picks."""
    high = _ephemeral_low()
    if high - PORT_FLOOR >= 1000:
        for _ in range(attempts):
            port = random.randrange(PORT_FLOOR, high)
            if _bindable(port):
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None


VLLM_MODULE = "vllm.entrypoints.openai.api_server"


def build_command(
    python: Path,
    model_dir: Path,
    port: int,
    served_names: list[str],
    serving: ServingConfig,
    *,
    cuda: bool,
) -> list[str]:
    """The process backend's command line: the serving python, vLLM's module, its args."""
    return [str(python), "-m", VLLM_MODULE] + vllm_args(
        model_dir, "127.0.0.1", port, served_names, serving, cuda=cuda
    )


def vllm_args(
    model_dir: Path,
    host: str,
    port: int,
    served_names: list[str],
    serving: ServingConfig,
    *,
    cuda: bool,
) -> list[str]:
    """vLLM's arguments, the same for both backends (a container listens on its own
    address on the project's isolated network, published on the host's 127.0.0.1 only).
    ``serving.extra_args`` pass only through the allow-list (ConfigError otherwise).

    The served names and the model folder come from the release record too: a name that is
    not a served name (one starting with '-' would be read as a flag: ``--host=0.0.0.0``)
    or a folder that reads as a flag is a ConfigError, whatever let it through before."""
    from llm_release.safety import served_name  # (here: the rest of serve.py needs none)

    if not served_names:
        raise ConfigError("a server needs a served name", hint="name the model it serves")
    for name in served_names:
        served_name(name, "served name")
    if str(model_dir).startswith("-"):
        raise ConfigError(
            f"model folder {ascii(str(model_dir))[:120]} reads as a flag",
            hint="name the model folder by its absolute path",
        )
    cmd = [
        "--model",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        *served_names,
        "--max-model-len",
        str(serving.max_model_len),
        "--dtype",
        serving.dtype,
        "--enable-prefix-caching"
        if serving.enable_prefix_caching
        else "--no-enable-prefix-caching",
        "--disable-uvicorn-access-log",
        # Every path but /health asks for the project's key (llm_release.server_key).
        "--middleware",
        server_key.MIDDLEWARE,
    ]
    if serving.max_num_seqs is not None:  # None (not resolved by a server): vLLM's default
        cmd += ["--max-num-seqs", str(serving.max_num_seqs)]
    if serving.enforce_eager:
        cmd.append("--enforce-eager")
    if serving.speculation is not None:  # typed: a method and numbers, never a path
        cmd += ["--speculative-config", serving.speculation.vllm_json()]
    if cuda:
        cmd += ["--gpu-memory-utilization", str(serving.gpu_memory_utilization)]
    cmd += serving.parallel_args()
    # Checked again where both backends build the command: settings changed after
    # validation (a candidate's arguments joined, a tuning setting applied) pass the same
    # allow-list (llm_release.serving.serving_flags) before they reach vLLM.
    try:
        check_serving_args(serving.extra_args, "serving.extra_args")
    except ValueError as exc:
        raise ConfigError(
            str(exc), hint="remove the flag, or ask the operator to allow it"
        ) from None
    # A reasoning model's family parser (qwen3 for Qwen3 / Qwen3.5): its thinking goes to
    # the answer's reasoning field, not into the content a client scores or shows.
    cmd += reasoning.parser_args(model_dir, serving.extra_args)
    cmd += serving.extra_args
    return cmd


def resolve_dtype(serving: ServingConfig, model_dir: Path) -> ServingConfig:
    """``fastest`` made concrete for this host (measured once per host and runtime)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return serving.model_copy(
        update={"dtype": served_dtype(serving.dtype, hardware.detect(), config)}
    )


def cpu_threads_bind(serving: ServingConfig, role: str, allowed: set[int] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a CPU server of ``role``.

    vLLM's ``auto`` binds the OpenMP threads of every server to the first cores this
    process may use (on 2 cores: "core ids=[0], reserved_cpus=[1]"), so a canary started next
    to the stable shares its core: in the demo of 2026-12-01 the canary's TTFT p95 was
    4.61 s against the stable's 0.17 s at 50% and the update was rolled back. ``split`` gives
    a canary the upper half of the CPUs and every other server the lower half; for a server
    alone on 2 cores that is core 0, what ``auto`` chose, so measurements do not change."""
    if serving.cpu_threads_bind != "split":
        return serving.cpu_threads_bind
    cpus = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    if len(cpus) < 2:
        return ",".join(str(c) for c in cpus) or "auto"
    lower = (len(cpus) + 1) // 2
    chosen = cpus[lower:] if role == "canary" else cpus[:lower]
    return ",".join(str(c) for c in chosen)


def cpu_env(serving: ServingConfig, role: str) -> dict[str, str]:
    """vLLM CPU's own settings for a server of ``role`` (both backends; ignored on a GPU)."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(serving.cpu_kvcache_space_gib),
        "VLLM_CPU_OMP_THREADS_BIND": cpu_threads_bind(serving, role),
    }


def server_env(serving: ServingConfig, role: str = "candidate") -> dict[str, str]:
    env = child_env()  # the pipeline's secrets have no business in a model server
    env |= cpu_env(serving, role)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env["HF_HUB_OFFLINE"] = "1"
    # Inherited by every process of the server's tree, whatever it renames itself to
    # (vLLM's 'VLLM::EngineCore'): 'down' finds orphans of this home by it.
    env[processes.HOME_MARK] = str(paths.home().resolve())
    # The lock on every path but /health (llm_release.server_key): the key, and the folder
    # of the middleware vLLM's --middleware imports.
    env[server_key.KEY_ENV] = server_key.key()
    env["PYTHONPATH"] = str(MIDDLEWARE_DIR)
    return env


@dataclass
class Endpoint:
    base_url: str
    served_name: str
    metrics_url: str
    port: int
    pid: int
    log_path: str
    # The docker backend's container (id); the process backend's server is ``pid``.
    container: str | None = None
    # A supervised release's supervisor serves its restart figures here (``supervise.py``).
    supervisor_port: int | None = None


@dataclass(frozen=True)
class Owner:
    """What a server is for: its role and the run or release it belongs to. The docker
    backend names and labels its container with it; both backends key GPU claims by it."""

    role: str = "candidate"  # candidate | stable | canary
    run_id: str | None = None
    release_id: str | None = None
    candidate: str | None = None

    def key(self) -> str:
        parts = [self.role, self.release_id or self.run_id or "", self.candidate or ""]
        return "-".join(p for p in parts if p)


class Server(ABC):
    """A vLLM OpenAI-compatible server, wherever it runs. The endpoint contract is the
    same for every backend: ready only when ``/health`` answers and one completion came
    back, a failure carries the log tail and the likely cause, ``stop`` on every exit path
    (use it as a context manager)."""

    backend = "abstract"

    def __init__(
        self,
        model_dir: Path,
        served_names: list[str],
        serving: ServingConfig,
        log_path: Path,
        *,
        port: int | None = None,
        owner: Owner | None = None,
    ) -> None:
        if not served_names:
            raise ConfigError("a vLLM server needs at least one served model name")
        self.model_dir = Path(model_dir)
        self.served_names = served_names
        self.serving = serving
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.port_picked = not port
        self.owner = owner or Owner(candidate=served_names[0])
        self.gpus: list[int] = []
        self.started = False
        # Where this start's output begins in ``log_path`` (a restarted release, or a start
        # on a new port, appends): a diagnosis reads this start's output only.
        self.log_start = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def gpu_holder(self) -> str:
        return f"{self.owner.key()}@{self.port}"

    def endpoint(self) -> Endpoint:
        return Endpoint(
            base_url=self.base_url,
            served_name=self.served_names[0],
            metrics_url=f"{self.base_url}/metrics",
            port=self.port,
            pid=self.pid(),
            log_path=str(self.log_path),
            container=self.container_id(),
        )

    def pid(self) -> int:
        return 0

    def container_id(self) -> str | None:
        return None

    def _prepare(self) -> None:
        """Checks and settings both backends share, before anything starts."""
        if not (self.model_dir / "config.json").exists():
            raise ServeError(
                f"{self.model_dir} has no config.json", hint="re-run the acquire stage"
            )
        if not has_cuda():
            # vLLM CPU's fp8 KV cache needs AVX-512 or AMX: refused here in one line,
            # not by its engine after half a minute of start-up.
            check_kv_cache(
                self.serving.kv_cache_dtype,
                self.serving.extra_args,
                json.loads((self.model_dir / "config.json").read_text()),
                hardware.detect(),
            )
        if self.serving.dtype == "fastest":
            self.serving = resolve_dtype(self.serving, self.model_dir)
        if self.serving.max_num_seqs is None:
            self.serving = resolve_batch(self.model_dir, self.serving, hardware.detect())
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

    def _claim_gpus(self) -> None:
        if has_cuda():
            self.gpus = gpus.claim(
                self.gpu_holder, self.serving, gpus.host_gpus(), backend=self.serving.backend
            )

    def _give_back_gpus(self) -> None:
        if self.gpus:
            gpus.give_back(self.gpu_holder)
            self.gpus = []

    @abstractmethod
    def start(self) -> Endpoint: ...

    @abstractmethod
    def exit_code(self) -> int | None:
        """The server's exit status once it has exited; None while it runs."""

    @abstractmethod
    def stop(self, grace_s: float = 20) -> None: ...

    def sync_log(self) -> None:  # noqa: B027 - a hook: the process writes its log itself
        """Bring ``log_path`` up to date (the docker backend copies the container's log)."""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log_text()
        return "\n".join(text.splitlines()[-lines:])

    def mark_log_start(self) -> None:
        """This start's output begins at the log file's present end."""
        try:
            self.log_start = self.log_path.stat().st_size
        except FileNotFoundError:
            self.log_start = 0

    def log_text(self, max_bytes: int = 2_000_000) -> str:
        """This start's output (its last ``max_bytes``)."""
        self.sync_log()
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(max(self.log_start, self.log_path.stat().st_size - max_bytes))
                return fh.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.started and self.exit_code() is None

    def what(self) -> str:
        return f"vLLM for {self.served_names[-1]}"

    def wait_healthy(self, timeout_s: float | None = None) -> Endpoint:
        assert self.started, "start() first"
        timeout_s = timeout_s if timeout_s is not None else self.serving.startup_timeout_s
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                text = self.log_text()
                raise ServeError(
                    f"{self.what()} exited with code {code} before it was "
                    f"healthy; likely cause: {diagnose(text)}",
                    log_tail=self.log_tail(),
                )
            try:
                healthy = requests.get(f"{self.base_url}/health", timeout=2).status_code == 200
            except requests.RequestException:
                healthy = False
            if healthy:
                self._check_names()
                self._answer_once(deadline)
                return self.endpoint()
            time.sleep(1)
        tail = self.log_tail()
        cause = diagnose(self.log_text())
        self.stop()
        raise ServeError(
            f"{self.what()} was not healthy after {timeout_s:.0f}s; likely cause: {cause}",
            log_tail=tail,
            hint="raise serving.startup_timeout_s if the machine is slow (first start compiles)",
        )

    def _check_names(self) -> None:
        """The server answering on our port serves our names (``/v1/models``); another's
        answer means another server bound the port first: ServeError, a taken port. So
        does a refusal of this home's key (another home's server, locked with its key)."""
        try:
            reply = requests.get(
                f"{self.base_url}/v1/models", headers=server_key.headers(), timeout=10
            )
            if reply.status_code == 401:
                raise ServeError(
                    f"port {self.port} answers for another server (it refuses this home's "
                    "key): it bound the port before this one could"
                )
            ids = {m.get("id") for m in reply.json().get("data", []) if isinstance(m, dict)}
        except (requests.RequestException, ValueError, AttributeError):
            return  # no list to compare: the first completion below tells
        # (an empty list says nothing: only a list of other names is another server's)
        if reply.status_code == 200 and ids and not set(self.served_names) <= ids:
            raise ServeError(
                f"port {self.port} answers for another server (models "
                f"{sorted(str(i) for i in ids)[:5]}, not {self.served_names}): it bound the "
                "port before this one could"
            )

    def _answer_once(self, deadline: float) -> None:
        """Ready means answering: /health can say 200 while the first request kills the
        engine (seen with W4A16 on an AVX2-only CPU), so one real completion is asked for."""
        body = {"model": self.served_names[0], "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        try:
            response = requests.post(
                f"{self.base_url}/v1/completions",
                json=body,
                headers=server_key.headers(),
                timeout=max(10.0, deadline - time.monotonic()),
            )
            if response.status_code == 200 and response.json().get("choices"):
                return
            problem = f"HTTP {response.status_code}: {response.text[:200]}"
        except (requests.RequestException, ValueError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        raise self.died_error("its first completion", problem)

    def died_error(self, during: str, problem: str = "") -> ServeError:
        """The error for a server that failed after /health: cause and tail from its log."""
        for _ in range(10):  # the engine's traceback reaches the log a moment later
            if self.exit_code() is not None:
                break
            time.sleep(0.5)
        code = self.exit_code()
        state = f"exited with code {code}" if code is not None else "stopped answering"
        text = self.log_text()
        return ServeError(
            f"{self.what()} {state} during {during}"
            + (f" ({problem})" if problem else "")
            + f"; likely cause: {diagnose(text)}",
            log_tail=self.log_tail(),
        )

    def start_healthy(self, timeout_s: float | None = None) -> Endpoint:
        """Start and wait until healthy; stopped again on any failure. A port this server
        picked itself and found taken when it came to bind is picked again (``PORT_RETRIES``
        times at most); a port it was given is the caller's, and its failure is reported."""
        for attempt in range(PORT_RETRIES + 1):
            try:
                self.start()
                return self.wait_healthy(timeout_s)
            except ServeError as exc:
                self.stop()
                if not (self.port_picked and attempt < PORT_RETRIES and self._port_taken(exc)):
                    raise
            except BaseException:
                self.stop()
                raise
            taken, self.port = self.port, free_port()
            log.warning(
                "%s: port %d was taken before it could bind; starting again on port %d",
                self.what(),
                taken,
                self.port,
            )
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    @staticmethod
    def _port_taken(exc: ServeError) -> bool:
        return bool(PORT_TAKEN.search(str(exc)))

    def __enter__(self) -> Server:
        self.start_healthy()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class VllmServer(Server):
    """The process backend: a vLLM process of the serving virtualenv in its own session."""

    backend = "process"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.process: subprocess.Popen | None = None

    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    def start(self) -> Endpoint:
        python = paths.vllm_python()
        if not python.exists():
            raise ServeError(
                f"the serving virtualenv's python {python} does not exist",
                hint="run 'make setup' to create .venv-vllm, or set LLM_RELEASE_VLLM_PYTHON",
            )
        self._prepare()
        cuda = has_cuda()
        cmd = build_command(
            python, self.model_dir, self.port, self.served_names, self.serving, cuda=cuda
        )
        env = server_env(self.serving, self.owner.role)
        self._claim_gpus()
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        try:
            env |= self._batch_invariance()
            self._launch(cmd, env)
        except BaseException:
            self._give_back_gpus()
            raise
        if self.gpus:
            from llm_release.serving import gpus

            gpus.bind(
                self.gpu_holder,
                pid=self.process.pid,
                pid_started=processes.start_time(self.process.pid),
            )
        return self.endpoint()

    def _batch_invariance(self) -> dict[str, str]:
        on, why = batch_invariance.enabled(self.serving, self.gpus or None)
        log.info("%s: batch-invariant decoding %s (%s)", self.what(), "on" if on else "off", why)
        return {batch_invariance.ENV: "1" if on else "0"}

    def _launch(self, command: list[str], env: dict[str, str]) -> None:
        """Start vLLM itself (a supervised server starts its supervisor here instead)."""
        self.mark_log_start()
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            # Own session: the whole process tree can be signalled, and it outlives the
            # caller when a release keeps it running behind the router.
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                umask=0o077,  # vLLM's ZMQ sockets in /tmp: its owner's alone
                start_new_session=True,
            )
        self.started = True

    def exit_code(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def stop(self, grace_s: float = 20) -> None:
        if self.process is None:
            return
        stop_process_group(self.process.pid, grace_s)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._give_back_gpus()


def stop_process_group(pid: int, grace_s: float = 20) -> bool:
    """SIGTERM the process group led by ``pid``, SIGKILL it after ``grace_s``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(pid)
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        # Orphans that exited are zombies until their adopter collects them: stopped.
        if not processes.group_alive(pid):
            return True
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is our exited child, so a zombie does not look alive."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
