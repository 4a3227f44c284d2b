"""Run one vLLM OpenAI-compatible server per candidate, in the serving virtualenv."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from . import hardware, paths
from .config import ServingConfig
from .credentials import child_env
from .errors import ConfigError, ServeError

LOG_TAIL_LINES = 40

# (pattern in the server log, what it most likely means)
LIKELY_CAUSES: list[tuple[re.Pattern[str], str]] = [
    (
        # vLLM CPU 0.32's AVX2 library has no W4A16 kernel: healthy, then dead at request one.
        re.compile(r"'_OpNamespace' '_C' object has no attribute '\w+'|has no attribute 'cpu_\w+'"),
        "this vLLM build has no kernel for this quantization scheme on this processor",
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
    (re.compile(r"(?i)Address already in use"), "the port is taken: pick another port"),
    (
        re.compile(r"(?i)No such file or directory.*config\.json|does not appear to have a file"),
        "the model directory is incomplete: re-run acquire/quantize",
    ),
]


def likely_cause(log_text: str) -> str:
    for pattern, cause in LIKELY_CAUSES:
        if pattern.search(log_text):
            return cause
    return "see the log tail below"


def diagnose(log_text: str) -> str:
    """The likely cause, with the log line that shows it (it is often far above the tail)."""
    for pattern, cause in LIKELY_CAUSES:
        match = pattern.search(log_text)
        if match:
            return f"{cause} (log: {match.group(0)!r})"
    return "see the log tail below"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None


def build_command(
    python: Path,
    model_dir: Path,
    port: int,
    served_names: list[str],
    serving: ServingConfig,
    *,
    cuda: bool,
) -> list[str]:
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        *served_names,
        "--max-model-len",
        str(serving.max_model_len),
        "--max-num-seqs",
        str(serving.max_num_seqs),
        "--dtype",
        serving.dtype,
        "--enable-prefix-caching"
        if serving.enable_prefix_caching
        else "--no-enable-prefix-caching",
        "--disable-uvicorn-access-log",
    ]
    if serving.enforce_eager:
        cmd.append("--enforce-eager")
    if cuda:
        cmd += ["--gpu-memory-utilization", str(serving.gpu_memory_utilization)]
    cmd += serving.extra_args
    return cmd


def resolve_dtype(serving: ServingConfig, model_dir: Path) -> ServingConfig:
    """``fastest`` made concrete for this host (measured once per host and runtime)."""
    from .probe import served_dtype

    config = json.loads((Path(model_dir) / "config.json").read_text())
    return serving.model_copy(
        update={"dtype": served_dtype(serving.dtype, hardware.detect(), config)}
    )


def server_env(serving: ServingConfig) -> dict[str, str]:
    env = child_env()  # the pipeline's secrets have no business in a model server
    env["VLLM_CPU_KVCACHE_SPACE"] = str(serving.cpu_kvcache_space_gib)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env["HF_HUB_OFFLINE"] = "1"
    return env


@dataclass
class Endpoint:
    base_url: str
    served_name: str
    metrics_url: str
    port: int
    pid: int
    log_path: str


class VllmServer:
    """A vLLM process. Use as a context manager so it is torn down on every exit path."""

    def __init__(
        self,
        model_dir: Path,
        served_names: list[str],
        serving: ServingConfig,
        log_path: Path,
        *,
        port: int | None = None,
    ) -> None:
        if not served_names:
            raise ConfigError("a vLLM server needs at least one served model name")
        self.model_dir = Path(model_dir)
        self.served_names = served_names
        self.serving = serving
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def endpoint(self) -> Endpoint:
        assert self.process is not None
        return Endpoint(
            base_url=self.base_url,
            served_name=self.served_names[0],
            metrics_url=f"{self.base_url}/metrics",
            port=self.port,
            pid=self.process.pid,
            log_path=str(self.log_path),
        )

    def start(self) -> Endpoint:
        python = paths.vllm_python()
        if not python.exists():
            raise ServeError(
                f"the serving virtualenv's python {python} does not exist",
                hint="run 'make setup' to create .venv-vllm, or set LLM_RELEASE_VLLM_PYTHON",
            )
        if not (self.model_dir / "config.json").exists():
            raise ServeError(
                f"{self.model_dir} has no config.json", hint="re-run the acquire stage"
            )
        if self.serving.dtype == "fastest":
            self.serving = resolve_dtype(self.serving, self.model_dir)
        cmd = build_command(
            python, self.model_dir, self.port, self.served_names, self.serving, cuda=has_cuda()
        )
        env = server_env(self.serving)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            # Own session: the whole process tree can be signalled, and it outlives the
            # caller when a release keeps it running behind the router.
            self.process = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        return self.endpoint()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_healthy(self, timeout_s: float | None = None) -> Endpoint:
        assert self.process is not None, "start() first"
        timeout_s = timeout_s if timeout_s is not None else self.serving.startup_timeout_s
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise ServeError(
                    f"vLLM for {self.served_names[-1]} exited with code {code} before it was "
                    f"healthy; likely cause: {diagnose(self.log_text())}",
                    log_tail=self.log_tail(),
                )
            try:
                healthy = requests.get(f"{self.base_url}/health", timeout=2).status_code == 200
            except requests.RequestException:
                healthy = False
            if healthy:
                self._answer_once(deadline)
                return self.endpoint()
            time.sleep(1)
        tail = self.log_tail()
        cause = diagnose(self.log_text())
        self.stop()
        raise ServeError(
            f"vLLM for {self.served_names[-1]} was not healthy after {timeout_s:.0f}s; "
            f"likely cause: {cause}",
            log_tail=tail,
            hint="raise serving.startup_timeout_s if the machine is slow (first start compiles)",
        )

    def _answer_once(self, deadline: float) -> None:
        """Ready means answering: /health can say 200 while the first request kills the
        engine (seen with W4A16 on an AVX2-only CPU), so one real completion is asked for."""
        body = {"model": self.served_names[0], "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        try:
            response = requests.post(
                f"{self.base_url}/v1/completions",
                json=body,
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
        assert self.process is not None
        for _ in range(10):  # the engine's traceback reaches the log a moment later
            if self.process.poll() is not None:
                break
            time.sleep(0.5)
        code = self.process.poll()
        state = f"exited with code {code}" if code is not None else "stopped answering"
        text = self.log_text()
        return ServeError(
            f"vLLM for {self.served_names[-1]} {state} during {during}"
            + (f" ({problem})" if problem else "")
            + f"; likely cause: {diagnose(text)}",
            log_tail=self.log_tail(),
        )

    def log_text(self, max_bytes: int = 2_000_000) -> str:
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(max(0, self.log_path.stat().st_size - max_bytes))
                return fh.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 20) -> None:
        if self.process is None:
            return
        stop_process_group(self.process.pid, grace_s)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> VllmServer:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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


def start_detached(
    model_dir: Path,
    served_names: list[str],
    serving: ServingConfig,
    log_path: Path,
    *,
    port: int | None = None,
) -> Endpoint:
    """Start a server that outlives this process (stable/canary behind the router)."""
    server = VllmServer(model_dir, served_names, serving, log_path, port=port)
    server.start()
    try:
        return server.wait_healthy()
    except BaseException:
        server.stop()
        raise
