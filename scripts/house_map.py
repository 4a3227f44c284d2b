"""The house map (issue 22): where each module of the old flat ``llm_release`` lives now.

    python scripts/house_map.py apply [ROOT]   # move the files, rewrite every reference
    python scripts/house_map.py show           # print the map

``apply`` is idempotent and safe to re-run after merging a branch written against the
flat layout: (a) each old file that still exists is ``git mv``-ed to its room (a test file
to its room's test folder); (b) every import and dotted reference (``from llm_release.x
import``, ``from llm_release import x``, ``import llm_release.x``, ``"llm_release.x.attr"``
strings for monkeypatch or mock, ``src/llm_release/x.py`` paths in docs) in the project's
code, tests, scripts, docs and build files is rewritten to the new module; relative
imports inside ``src/llm_release`` are resolved against the file's old place and written
absolute (ruff's TID252 keeps them absolute afterwards). Changed Python files get ruff's
import sorting and formatting when ruff is installed.

Rules that keep it idempotent: no new module has the dotted name of an old moved module,
except ``llm_release.sizing`` (old: the release's sizing glue, now
``llm_release.serving.capacity``; new: the sizing room). For it only references to the old
module's own names are moved (``SCOPED``); ``from llm_release import sizing`` is the room.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

P = "llm_release"

# old module -> new module (dotted, from the import root). A package entry moves its
# submodules with it (llm_release.backends.docker -> llm_release.serving.backends.docker).
MOVES: dict[str, str] = {
    # hub/: sources, transfer, verify, the repo contract, metadata headers, disk checks
    f"{P}.acquire": f"{P}.hub.acquire",
    f"{P}.download": f"{P}.hub.download",
    f"{P}.hub_headers": f"{P}.hub.hub_headers",
    f"{P}.local_source": f"{P}.hub.local_source",
    f"{P}.credentials": f"{P}.hub.credentials",
    f"{P}.disk": f"{P}.hub.disk",
    # quantization/
    f"{P}.quantize": f"{P}.quantization.quantize",
    f"{P}.recipes": f"{P}.quantization.recipes",
    # sizing/: the planner (its public names from the package), corrections, vLLM's figures
    f"{P}.planner": f"{P}.sizing",
    f"{P}.corrections": f"{P}.sizing.corrections",
    f"{P}.vllm_report": f"{P}.sizing.vllm_report",
    # serving/
    f"{P}.serve": f"{P}.serving.serve",
    f"{P}.probe": f"{P}.serving.probe",
    f"{P}.serving_flags": f"{P}.serving.serving_flags",
    f"{P}.reasoning": f"{P}.serving.reasoning",
    f"{P}.processes": f"{P}.serving.processes",
    f"{P}.runtime_info": f"{P}.serving.runtime_info",
    f"{P}.gpus": f"{P}.serving.gpus",
    f"{P}.tune": f"{P}.serving.tune",
    f"{P}.backends": f"{P}.serving.backends",
    f"{P}.image": f"{P}.serving.backends.image",
    f"{P}.sizing": f"{P}.serving.capacity",  # SCOPED: see below
    # evaluation/
    f"{P}.evalsets": f"{P}.evaluation.evalsets",
    f"{P}.templates": f"{P}.evaluation.templates",
    f"{P}.metrics": f"{P}.evaluation.metrics",
    f"{P}.evaluate": f"{P}.evaluation.evaluate",
    f"{P}.stats": f"{P}.evaluation.stats",
    # load/
    f"{P}.loadtest": f"{P}.load.loadtest",
    f"{P}.traffic": f"{P}.load.traffic",
    # decision/
    f"{P}.select": f"{P}.decision.select",
    f"{P}.contenders": f"{P}.decision.contenders",
    f"{P}.decisions": f"{P}.decision.decisions",
    f"{P}.candidate": f"{P}.decision.candidate",
    f"{P}.measurements": f"{P}.decision.measurements",
    # canary/: the live rollout
    f"{P}.rollout": f"{P}.canary.rollout",
    f"{P}.router": f"{P}.canary.router",
    f"{P}.promote": f"{P}.canary.promote",
    f"{P}.analysis": f"{P}.canary.analysis",
    f"{P}.prometheus": f"{P}.canary.prometheus",
    f"{P}.alerts": f"{P}.canary.alerts",
    f"{P}.door": f"{P}.canary.door",
    # reporting/
    f"{P}.report": f"{P}.reporting.report",
    f"{P}.plots": f"{P}.reporting.plots",
    # out of the core package
    f"{P}.hub_server": "demo.hub_server",
    f"{P}.demo_model": "demo.demo_model",
}
# Kept at the package top (cross-cutting): errors, paths, fileio, config, results,
# registry, safety, hardware, preflight, cli.

# Names that left their old module when it was split: (old module, name) -> new module.
SPLITS: dict[tuple[str, str], str] = {}
for _name in ("make_server", "start_detached"):
    SPLITS[(f"{P}.serve", _name)] = f"{P}.serving.factory"
for _name in (
    "Record",
    "RuntimeInfo",
    "RUNTIME_INFO_SCRIPT",
    "RATE_METHOD",
    "MAX_PROBE_WIDTH",
    "PROBE_TOKENS",
    "runtime_info",
    "choose_dtype",
    "layer_shape",
    "served_dtype",
):
    SPLITS[(f"{P}.probe", _name)] = f"{P}.serving.dtype"
for _name in ("_tiny_tokenizer", "_save_tiny", "build_tiny_model", "build_tiny_moe_model"):
    SPLITS[(f"{P}.demo_model", _name)] = f"{P}.serving.tiny_models"
for _name in ("label", "client", "docker_available", "container_running", "LABEL", "PROJECT"):
    SPLITS[(f"{P}.backends.docker", _name)] = f"{P}.serving.backends.docker_client"
# Names that changed with the split (private names made public where shared):
# (old module, old name) -> (new module, new name).
RENAMES: dict[tuple[str, str], tuple[str, str]] = {
    (f"{P}.demo_model", "_finish_tokenizer"): (f"{P}.serving.tiny_models", "finish_tokenizer"),
    (f"{P}.demo_model", "_write_readme"): (f"{P}.serving.tiny_models", "write_readme"),
    (f"{P}.demo_model", "CHATML_TEMPLATE"): (f"{P}.serving.tiny_models", "CHATML_TEMPLATE"),
    (f"{P}.backends.docker", "_errors"): (f"{P}.serving.backends.docker_client", "sdk_errors"),
    (f"{P}.backends.docker", "_home_text"): (f"{P}.serving.backends.docker_client", "home_text"),
    (f"{P}.backends.docker", "_find"): (f"{P}.serving.backends.docker_client", "find_container"),
    (f"{P}.probe", "_key"): (f"{P}.serving.dtype", "cache_key"),
    (f"{P}.probe", "_read_cache"): (f"{P}.serving.dtype", "read_cache"),
}
for (_old, _name), (_new, _) in RENAMES.items():
    SPLITS[(_old, _name)] = _new
for _name in ("FLOAT32_MARGIN", "_runtime_versions", "_run"):
    SPLITS[(f"{P}.probe", _name)] = f"{P}.serving.dtype"
# the planner's private names some callers use, from the module that defines them
SPLITS[(f"{P}.planner", "_flag")] = f"{P}.sizing.planner"

# Old modules whose dotted name is also a new one: only these names move.
SCOPED: dict[str, set[str]] = {
    f"{P}.sizing": {
        "log",
        "_gpu_memory_gib",
        "_request",
        "plan_release",
        "read_release_model",
        "kv_check",
        "plan_for_dir",
        "resolve_batch",
    },
}

# Files that move and are not modules of the map (data next to the module that reads it).
FILES: dict[str, str] = {
    f"src/{P}/canary_queries.yaml": f"src/{P}/canary/canary_queries.yaml",
    f"src/{P}/planner.py": f"src/{P}/sizing/planner.py",
}

# Unit tests mirror the tree: tests/unit/<room>/.
TEST_ROOMS: dict[str, list[str]] = {
    "hub": ["test_credentials", "test_disk", "test_local_source"],
    "quantization": ["test_quantize", "test_recipes"],
    "sizing": [
        "test_planner",
        "test_planner_bounds",
        "test_planner_gpu",
        "test_corrections",
        "test_vllm_report",
    ],
    "serving": [
        "test_serve_args",
        "test_serving_flags",
        "test_probe",
        "test_container_spec",
        "test_reasoning",
        "test_sizing",
        "test_tune",
        "test_factory",
    ],
    "evaluation": ["test_eval_sets", "test_eval_set_limits", "test_metrics", "test_templates"],
    "load": ["test_loadtest", "test_traffic"],
    "decision": ["test_select", "test_measurements"],
    "canary": [
        "test_alerts",
        "test_analysis",
        "test_canary_weight",
        "test_promote",
        "test_prometheus_config",
        "test_rollout",
        "test_door",
    ],
    "reporting": ["test_report", "test_plots"],
}
TEST_RENAMES = {"test_sizing": "test_capacity"}

# Where references are rewritten.
TREES = ["src", "flows", "tasks", "blocks", "tests", "bench", "scripts", "demo", "docs", ".ci"]
TOP_FILES = ["Makefile", "prefect.yaml", "pyproject.toml", "README.md"]
SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".txt", ".cfg", ".ini", ""}
SELF = Path(__file__).resolve()


def _check_map() -> None:
    new = set(MOVES.values()) | set(SPLITS.values())
    clash = {old for old in MOVES if old in new or any(n.startswith(old + ".") for n in new)}
    clash -= set(SCOPED)
    clash.discard(f"{P}.planner")  # planner -> sizing: sizing is SCOPED, planner is not new
    assert not clash, f"old names reused by new modules (not idempotent): {clash}"


def module_path(module: str) -> Path:
    parts = module.split(".")
    base = Path("src") if parts[0] == P else Path()
    return base.joinpath(*parts).with_suffix(".py")


# moved packages and their submodules
PACKAGES: dict[str, set[str]] = {f"{P}.backends": {"docker", "process"}}


def _package_of(old: str) -> bool:
    return old in PACKAGES


def new_module(full: str) -> str | None:
    """The new name of an old module ``full`` (or of a submodule of a moved package);
    None when ``full`` is not an old moved module."""
    if full in SCOPED:
        return None
    if full in MOVES:
        return MOVES[full]
    for old, subs in PACKAGES.items():
        head, _, sub = full.rpartition(".")
        if head == old and sub in subs:
            return f"{MOVES[old]}.{sub}"
    return None


def new_home(module: str, name: str) -> str:
    """Where ``name``, imported from (old or new) ``module``, lives now."""
    if (module, name) in SPLITS:
        return SPLITS[(module, name)]
    if module in SCOPED:
        return MOVES[module] if name in SCOPED[module] else module
    return new_module(module) or module


# ---------------------------------------------------------------------------- rewriting

FROM_RE = re.compile(
    r"^(?P<indent>[ \t]*)from[ \t]+(?P<mod>\.+[\w.]*|llm_release[\w.]*)[ \t]+import[ \t]+"
    r"(?P<names>\((?:[^()]*)\)|(?:[^\n#\\]|\\\n)+)(?P<tail>[ \t]*#[^\n]*)?",
    re.M,
)


def _parse_names(text: str) -> list[tuple[str, str | None]] | None:
    text = text.strip()
    if text.startswith("("):
        text = text[1:-1]
    text = re.sub(r"#[^\n]*", "", text).replace("\\\n", " ")
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"([\w]+)(?:\s+as\s+(\w+))?", part)
        if not m:
            return None
        out.append((m.group(1), m.group(2)))
    return out


def _render(indent: str, module: str, names: list[str]) -> str:
    line = f"{indent}from {module} import {', '.join(names)}"
    if len(line) <= 100:
        return line
    body = "".join(f"{indent}    {n},\n" for n in names)
    return f"{indent}from {module} import (\n{body}{indent})"


def rewrite_from(match: re.Match, here_old: str | None) -> str:
    mod = match.group("mod")
    relative = mod.startswith(".")
    if relative:
        if here_old is None:
            return match.group(0)
        dots = len(mod) - len(mod.lstrip("."))
        base = here_old.split(".")[: len(here_old.split(".")) - dots]
        rest = mod.lstrip(".")
        mod = ".".join(base + ([rest] if rest else []))
    names = _parse_names(match.group("names"))
    if names is None:
        return match.group(0)
    groups: dict[str, list[str]] = {}
    for name, alias in names:
        full = f"{mod}.{name}"
        moved = new_module(full)
        if relative and full in SCOPED:
            moved = MOVES[full]  # a relative import is old code: the old module
        if moved is not None and "." in moved:
            parent, leaf = moved.rsplit(".", 1)
            local = alias or name
            groups.setdefault(parent, []).append(leaf if leaf == local else f"{leaf} as {local}")
            continue
        home = new_home(mod, name)
        if (mod, name) in RENAMES:
            renamed = RENAMES[(mod, name)][1]
            groups.setdefault(home, []).append(f"{renamed} as {alias or name}")
            continue
        groups.setdefault(home, []).append(f"{name} as {alias}" if alias else name)
    lines = [_render(match.group("indent"), m, ns) for m, ns in groups.items()]
    tail = match.group("tail") or ""
    lines[0] = lines[0] + tail if "\n" not in lines[0] else lines[0]
    if tail and "\n" in lines[0]:
        lines[-1] += tail
    if not relative and list(groups) == [mod]:
        return match.group(0)  # nothing moved: leave the statement as written
    return "\n".join(lines)


DOTTED_RE = re.compile(r"(?<![\w.])llm_release(?:\.\w+)+")


def rewrite_dotted(match: re.Match) -> str:
    parts = match.group(0).split(".")
    # the longest old module that prefixes the reference
    for cut in range(len(parts), 1, -1):
        module = ".".join(parts[:cut])
        rest = parts[cut:]
        if module in SCOPED:
            if rest:
                return ".".join([new_home(module, rest[0]), *rest])
            return match.group(0)  # the room
        moved = new_module(module)
        if moved is None:
            continue
        if rest:
            head = rest[0]
            if (module, head) in RENAMES:
                head = RENAMES[(module, head)][1]
            return ".".join([new_home(module, rest[0]), head, *rest[1:]])
        return moved
    return match.group(0)


def _path_map() -> dict[str, str]:
    out = {}
    for old, new in MOVES.items():
        if _package_of(old):
            out[str(module_path(old).with_suffix(""))] = str(module_path(new).with_suffix(""))
        elif new.startswith(P) or new.startswith("demo."):
            out[str(module_path(old))] = str(module_path(new))
    for old, new in FILES.items():
        out[old] = new
    out[f"src/{P}/planner.py"] = f"src/{P}/sizing/"
    for room, tests in TEST_ROOMS.items():
        for test in tests:
            target = TEST_RENAMES.get(test, test)
            out[f"tests/unit/{test}.py"] = f"tests/unit/{room}/{target}.py"
    return out


def rewrite_paths(text: str) -> str:
    for old, new in _path_map().items():
        text = re.sub(r"(?<![\w/])" + re.escape(old) + r"(?![\w])", new, text)
        short = old.removeprefix("src/")
        new_short = new.removeprefix("src/")
        if short != old:
            text = re.sub(r"(?<![\w/])" + re.escape(short) + r"(?![\w])", new_short, text)
    return text


TEST_DOTTED_RE = re.compile(r"(?<![\w.])tests\.unit\.(\w+)")


def rewrite_test_dotted(match: re.Match) -> str:
    for room, tests in TEST_ROOMS.items():
        if match.group(1) in tests:
            return f"tests.unit.{room}.{TEST_RENAMES.get(match.group(1), match.group(1))}"
    return match.group(0)


def rewrite_text(text: str, here_old: str | None, is_python: bool) -> str:
    text = FROM_RE.sub(lambda m: rewrite_from(m, here_old), text)
    text = DOTTED_RE.sub(rewrite_dotted, text)
    text = TEST_DOTTED_RE.sub(rewrite_test_dotted, text)
    return rewrite_paths(text)


# ---------------------------------------------------------------------------- moving


def git_mv(root: Path, old: Path, new: Path) -> bool:
    if not (root / old).exists() or (root / new).exists():
        return False
    (root / new).parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "mv", str(old), str(new)], cwd=root, check=True)
    return True


def move_files(root: Path) -> list[str]:
    moved = []
    for old, new in MOVES.items():
        if _package_of(old):
            src, dst = module_path(old).with_suffix(""), module_path(new).with_suffix("")
            if (root / src).is_dir():
                for f in sorted((root / src).rglob("*.py")):
                    rel = f.relative_to(root / src)
                    if git_mv(root, src / rel, dst / rel):
                        moved.append(f"{src / rel} -> {dst / rel}")
            continue
        if old == f"{P}.planner":
            continue  # a package now; its file is in FILES
        if git_mv(root, module_path(old), module_path(new)):
            moved.append(f"{module_path(old)} -> {module_path(new)}")
    for old, new in FILES.items():
        if git_mv(root, Path(old), Path(new)):
            moved.append(f"{old} -> {new}")
    for room, tests in TEST_ROOMS.items():
        for test in tests:
            target = TEST_RENAMES.get(test, test)
            old = Path("tests/unit") / f"{test}.py"
            new = Path("tests/unit") / room / f"{target}.py"
            if git_mv(root, old, new):
                moved.append(f"{old} -> {new}")
    return moved


def old_name_of(path: Path) -> str | None:
    """The old dotted module of a package file (relative imports there were written against
    it): its own name when it did not move, None outside the packages."""
    for old_file, new_file in FILES.items():
        if str(path) == new_file and old_file.endswith(".py"):
            path = Path(old_file)
    parts = list(path.with_suffix("").parts)
    if parts[:1] == ["src"]:
        parts = parts[1:]
    current = ".".join(parts)
    for old, new in MOVES.items():
        if current == new:
            return old
    for old, subs in PACKAGES.items():
        head, _, sub = current.rpartition(".")
        if head == MOVES[old] and sub in subs | {"__init__"}:
            return f"{old}.{sub}"
    return current if parts[:1] == [P] else None


def files_to_rewrite(root: Path) -> list[Path]:
    out = []
    for tree in TREES:
        base = root / tree
        if not base.exists():
            continue
        for f in base.rglob("*"):
            if not f.is_file() or f.suffix not in SUFFIXES or f.resolve() == SELF:
                continue
            if any(p in {".venv", "__pycache__", "data", "results"} for p in f.parts):
                continue
            out.append(f)
    out += [root / f for f in TOP_FILES if (root / f).exists()]
    return out


def rewrite_all(root: Path) -> list[Path]:
    changed = []
    for f in files_to_rewrite(root):
        try:
            text = f.read_text("utf-8")
        except UnicodeDecodeError:
            continue
        rel = f.relative_to(root)
        # relative imports resolve against the old module's package (for __init__, the
        # package itself: 'llm_release.backends.__init__' drops its last part alike)
        here = old_name_of(rel) if rel.suffix == ".py" else None
        new = rewrite_text(text, here, rel.suffix == ".py")
        if new != text:
            f.write_text(new, "utf-8")
            changed.append(f)
    return changed


def ruff(root: Path, files: list[Path]) -> None:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    py = [str(f) for f in files if f.suffix == ".py"]
    if not py or not Path(exe).exists():
        return
    subprocess.run([exe, "check", "--select", "I", "--fix", "-q", *py], cwd=root, check=False)
    subprocess.run([exe, "format", "-q", *py], cwd=root, check=False)


def apply(root: Path) -> None:
    _check_map()
    moved = move_files(root)
    changed = rewrite_all(root)
    ruff(root, changed)
    print(f"moved {len(moved)} files, rewrote {len(changed)} files")
    for line in moved:
        print("  mv", line)
    for f in changed:
        print("  rw", f.relative_to(root))


def show() -> None:
    _check_map()
    width = max(len(k) for k in MOVES)
    for old, new in MOVES.items():
        print(f"{old:<{width}}  ->  {new}")
    for (old, name), new in SPLITS.items():
        print(f"{old + '.' + name:<{width}}  ->  {new}.{name}")
    for old, names in SCOPED.items():
        print(f"{old} ({', '.join(sorted(names))})  ->  {MOVES[old]}")


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "apply":
        apply(Path(argv[1] if len(argv) > 1 else ".").resolve())
        return 0
    if len(argv) >= 1 and argv[0] == "show":
        show()
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
