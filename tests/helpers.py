import subprocess
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
