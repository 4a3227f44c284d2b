import contextvars
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

TINY_REPO = "tests/tiny-llama"


def require_tool(name: str) -> str:
    """The path of a command-line tool a test needs (promtool, prometheus, haproxy…); a
    missing one fails the test, never skips it: 'make setup' installs them all."""
    import shutil

    import pytest

    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: 'make setup' installs it", pytrace=False)
    return path


def stop_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM a process group a test started, SIGKILL it after ``grace_s``: a Prefect worker
    that gets SIGTERM while a flow run is ending can outlive any grace period (CI,
    2026-12-01), and a teardown must not fail on that."""
    from llm_release.serving.serve import stop_process_group

    stop_process_group(proc.pid, grace_s=grace_s)
    proc.wait(10)


def prefect_deploy(env: dict, *names: str, root: Path) -> None:
    """``prefect deploy --name NAME ...`` of prefect.yaml in ``root`` against ``env``'s API."""
    args = [str(Path(sys.executable).parent / "prefect"), "--no-prompt", "deploy"]
    for name in names:
        args += ["--name", name]
    done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def marked_env(home: Path | None = None) -> dict[str, str]:
    """This environment with a project home's mark (``processes.HOME_MARK``), as every
    server the project starts carries it: a stand-in for one of its servers needs it to be
    taken for the project's own (``processes.is_ours``). ``home``: LLM_RELEASE_HOME's."""
    from llm_release import paths
    from llm_release.serving import processes

    return {**os.environ, processes.HOME_MARK: str((home or paths.home()).resolve())}


def vllm_processes(
    marker: str = "vllm.entrypoints.openai.api_server", under: Path | None = None
) -> list[str]:
    """vLLM servers running now; with ``under``, only those serving a model below that folder
    (a test's home), so servers of other tests or sessions on the machine are not counted.
    Processes in containers (the docker backend's) are not counted either."""
    from llm_release.serving.processes import in_my_pid_namespace

    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    lines = [
        line
        for line in out.splitlines()
        if "pgrep" not in line and in_my_pid_namespace(int(line.split()[0]))
    ]
    if under is not None:
        lines = [line for line in lines if f"--model {under}/" in line]
    return lines


def answer_paused_run(approve: bool, comment: str) -> threading.Thread:
    """Resume the next paused flow run with an answer (approve, comment) sent through
    Prefect's API, as the UI's form does. Runs in a thread; join it to wait."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.flow_runs import resume_flow_run

    def run() -> None:
        deadline = time.monotonic() + 600
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline:
                paused = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(
                        state=FlowRunFilterState(
                            type=FlowRunFilterStateType(any_=[StateType.PAUSED])
                        )
                    )
                )
                if paused:
                    resume_flow_run(
                        paused[0].id, run_input={"approve": approve, "comment": comment}
                    )
                    return
                time.sleep(1)

    context = contextvars.copy_context()  # the test harness's API settings live in it
    thread = threading.Thread(target=context.run, args=(run,), daemon=True)
    thread.start()
    return thread


def drain_prefect_slot_services(timeout_s: float = 30) -> None:
    """Stop this process's Prefect slot-acquisition services. Prefect keeps one per set of
    limit names per process, on its global event-loop thread, with a client bound to the
    API it first talked to; a later test module with a server of its own would send its
    slot requests to the stopped server (a fresh-clone CI run failed so: ConnectError in
    test_side_by_side after the release e2e's server, then the harness hung at its exit).
    Drained before a module's server stops, the next module's slots start a new service
    on its own server."""
    from prefect.concurrency.services import (
        ConcurrencySlotAcquisitionService,
        ConcurrencySlotAcquisitionWithLeaseService,
    )

    for service in (ConcurrencySlotAcquisitionService, ConcurrencySlotAcquisitionWithLeaseService):
        service.drain_all(timeout=timeout_s)


def prefect_server_with_ui(base: Path):
    """A ``prefect server start`` on a free loopback port with its UI on (the test harness
    turns the UI off), this process's client pointed at it while the context is open."""
    import contextlib
    import os
    import sys

    import requests
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from llm_release.serving.serve import free_port

    @contextlib.contextmanager
    def server():
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
            "PREFECT_HOME": str(base / "prefect-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "true",
            # The address the UI's scripts call (default: port 4200, not this one).
            "PREFECT_UI_API_URL": f"{url}/api",
            "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
        }
        log = base / "prefect-server.log"
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "prefect"),
                *("server", "start", "--host", "127.0.0.1", "--port", str(port)),
            ],
            env=env,
            stdout=open(log, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if requests.get(f"{url}/api/health", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            # The environment too: a thread that does not carry this context reads it.
            previous = os.environ.get("PREFECT_API_URL")
            os.environ["PREFECT_API_URL"] = f"{url}/api"
            try:
                with temporary_settings({PREFECT_API_URL: f"{url}/api"}):
                    try:
                        yield url
                    finally:
                        drain_prefect_slot_services()
            finally:
                if previous is None:
                    os.environ.pop("PREFECT_API_URL", None)
                else:
                    os.environ["PREFECT_API_URL"] = previous
        finally:
            stop_group(proc)

    return server()


def chromium_page(url: str, png: Path, wait_ms: int = 20000, until: str | None = None) -> str:
    """Load ``url`` in headless Chromium (Debian's), save a screenshot to ``png`` and return
    the page's DOM after its scripts ran (the Prefect UI is a single-page app). ``until``:
    text the rendered page shows; on a loaded host the app can still be empty when the
    virtual-time budget ends (CI64), so the DOM is read again, at most three times."""
    import shutil

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: 'make setup' installs it"
    common = [
        chromium,
        "--headless",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1600,1400",
        f"--virtual-time-budget={wait_ms}",
    ]
    shot = subprocess.run(
        [*common, f"--screenshot={png}", url], capture_output=True, text=True, timeout=180
    )
    assert shot.returncode == 0 and png.stat().st_size > 10_000, shot.stderr[-2000:]
    for _ in range(3):
        dom = subprocess.run(
            [*common, "--dump-dom", url], capture_output=True, text=True, timeout=180
        )
        assert dom.returncode == 0, dom.stderr[-2000:]
        if until is None or until in dom.stdout:
            break
    return dom.stdout


def lb_headers(status: dict) -> dict[str, str]:
    """The load balancer's key header, from the key file 'canary status --json' names."""
    key = Path(status["api_key_file"]).read_text().strip()
    return {"Authorization": f"Bearer {key}"}
