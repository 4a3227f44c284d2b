import subprocess

TINY_REPO = "tests/tiny-llama"


def vllm_processes(marker: str = "vllm.entrypoints.openai.api_server") -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]
