import contextvars
import subprocess
import threading
import time
from pathlib import Path

TINY_REPO = "tests/tiny-llama"


def vllm_processes(
    marker: str = "vllm.entrypoints.openai.api_server", under: Path | None = None
) -> list[str]:
    """vLLM servers running now; with ``under``, only those serving a model below that folder
    (a test's home), so servers of other tests or sessions on the machine are not counted.
    Processes in containers (the docker backend's) are not counted either."""
    from llm_release.processes import in_my_pid_namespace

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
