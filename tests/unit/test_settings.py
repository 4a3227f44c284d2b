"""One Settings: every environment variable the project reads is a documented field of
``llm_release.settings.Settings``, read nowhere else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from llm_release.errors import ConfigError
from llm_release.settings import TRUSTED, Settings, env_names, markdown_table, settings

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
CODE = ("src", "flows", "tasks", "blocks")
NAME = re.compile(r"LLM_RELEASE_[A-Z0-9_]*")
# Uses of os.environ that are not a setting's read, by the function they are in.
NOT_A_READ = {
    "child_env": "copies the environment, less secrets, for a child process (vLLM, HAProxy…)",
    "serving_requirements": "the environment plus one variable, for a pip child process",
    "fill_wheelhouse": "the environment plus one variable, for a pip child process",
    "_offline": "sets HF_*_OFFLINE for lm-eval in this process and restores them after",
    "server_key_from_environment": "the vLLM middleware, inside the server: the key it was "
    "given (llm_release.server_key), not a setting",
}
ENVIRON = {"environ", "environb", "getenv", "getenvb"}


def python_files() -> list[Path]:
    return sorted(f for top in CODE for f in (ROOT / top).rglob("*.py"))


def test_every_llm_release_variable_named_in_the_code_is_a_setting():
    fields = env_names()
    files = [*python_files(), ROOT / "Makefile", ROOT / "prefect.yaml"]
    named = {
        (name, str(f.relative_to(ROOT))) for f in files for name in NAME.findall(f.read_text())
    }
    assert len({n for n, _ in named}) >= 10  # the scan sees the tree
    missing = []
    for name, where in sorted(named):
        if name.endswith("_"):  # a family, e.g. LLM_RELEASE_DOCKER_* in a docstring
            if not any(f.startswith(name) for f in fields):
                missing.append(f"{name}* ({where})")
        elif name not in fields:
            missing.append(f"{name} ({where})")
    assert not missing, f"not a field of Settings: {missing}"


def environ_uses(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every os.environ / os.getenv in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ENVIRON
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(a.name in ENVIRON for a in node.names)
        ):
            found.append((function, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_no_module_but_settings_reads_the_environment():
    reads, allowed = [], set()
    for path in python_files():
        if path.name == "settings.py" and path.parent.name == "llm_release":
            continue
        for function, line in environ_uses(path):
            if function in NOT_A_READ:
                allowed.add(function)
            else:
                reads.append(f"{path.relative_to(ROOT)}:{line} in {function}")
    assert not reads, f"read the environment through llm_release.settings: {reads}"
    # Every exception is still in the tree (a stale one would hide a new read).
    assert allowed == set(NOT_A_READ)


def test_the_scan_finds_a_read(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import os\nfrom os import getenv\n\ndef f():\n    return os.environ.get('X')\n"
    )
    assert environ_uses(module) == [("<module>", 2), ("f", 5)]


def test_settings_are_read_from_the_environment_at_each_call(monkeypatch):
    monkeypatch.setenv("LLM_RELEASE_ROUTER_PORT", "18080")
    assert settings().router_port == 18080
    monkeypatch.setenv("LLM_RELEASE_ROUTER_PORT", " 18081 ")
    assert settings().router_port == 18081
    monkeypatch.setenv("LLM_RELEASE_ROUTER_PORT", "  ")  # blank is unset
    assert settings().router_port == 8080
    monkeypatch.setenv("LLM_RELEASE_LOCAL_ROOTS", "/srv/a:/srv/b")
    monkeypatch.setenv("LLM_RELEASE_HF_TOKEN_ENDPOINTS", "https://a.example, https://b.example")
    monkeypatch.setenv("LLM_RELEASE_PROMETHEUS_PORT", "auto")
    monkeypatch.setenv("LLM_RELEASE_DOCKER_IPC_HOST", "yes")
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-secret")
    current = settings()
    assert current.local_roots == (Path("/srv/a"), Path("/srv/b"))
    assert current.hf_token_endpoints == ("https://a.example", "https://b.example")
    assert current.prometheus_port == "auto" and current.docker_ipc_host is True
    assert "ms-secret" not in repr(current)
    assert current.modelscope_api_token.get_secret_value() == "ms-secret"


def test_the_fleet_hub_is_three_operator_settings(monkeypatch):
    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_ENDPOINT", " http://10.0.0.5:8765 ")
    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_ORG", "ml-fleet")
    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_CREDENTIALS", "fleet-hub")
    current = settings()
    assert current.fleet_hub_endpoint == "http://10.0.0.5:8765"
    assert (current.fleet_hub_org, current.fleet_hub_credentials) == ("ml-fleet", "fleet-hub")
    # a run's parameters never reach them: the run form (ReleaseConfig) has no such field
    from llm_release.config import ReleaseConfig

    assert not [f for f in ReleaseConfig.model_fields if "fleet" in f]


@pytest.mark.parametrize(
    "variable, value, says",
    [
        ("LLM_RELEASE_ROUTER_PORT", "eighty", "valid integer"),
        ("LLM_RELEASE_SLOT_LEASE_S", "soon", "valid number"),
        ("PREFECT_SERVER_API_PORT", "x", "valid integer"),
        ("LLM_RELEASE_DOCKER_SHM_GIB", "512", "at most 256"),
        ("LLM_RELEASE_HUB_LOG", "loud", "is not a boolean"),
        ("LLM_RELEASE_PLAN_DEADLINE_S", "-1", r"not a number of seconds in \(0, 3600\]"),
        ("LLM_RELEASE_LOCAL_ROOTS", "models", "not an absolute path"),
        ("LLM_RELEASE_HOST_NAME", "gpu-a/../x", "should match pattern"),
        ("LLM_RELEASE_FLEET_HUB_ORG", "fleet/other", "should match pattern"),
        ("LLM_RELEASE_FLEET_HUB_CREDENTIALS", "Fleet Hub", "should match pattern"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, variable, value, says):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=says) as info:
        settings()
    line = info.value.one_line()
    assert "\n" not in line and line.startswith(variable) and "how to fix:" in line


def test_every_field_is_documented_as_an_operator_setting():
    for field, info in Settings.model_fields.items():
        assert info.description and info.description.endswith(TRUSTED), field


def test_docs_list_every_setting_with_its_default():
    text = (ROOT / "docs" / "settings.md").read_text()
    assert markdown_table() in text, "regenerate: python -m llm_release.settings"
    rows = {line.split("|")[1].strip(" `"): line for line in text.splitlines() if "| `" in line}
    for name, field in env_names().items():
        default = Settings.model_fields[field].default
        assert name in rows, name
        shown = {None: "unset", (): "empty", False: "0", True: "1"}.get(default, default)
        cell = rows[name].split("|")[3].strip(" `")
        assert cell == (f"{shown:g}" if isinstance(shown, float) else str(shown)), name
