"""Stand-ins of a host's Python packages, for resolving a wheelhouse as setup resolves it there.

    python scripts/host_standins.py FREEZE SITE_DIR [REPORT]

FREEZE is the host interpreter's ``pip list --format=freeze`` (``name==version`` a line).
Writes, under SITE_DIR, one ``NAME-VERSION.dist-info`` per package holding its name and
version, and a ``.pth`` file naming SITE_DIR into the site-packages of the interpreter that
runs this (a scratch virtualenv): pip there then sees the host's packages as installed, keeps
those that satisfy a requirement and resolves the rest, as the host's setup will
(scripts/wheelhouse.sh --host-packages). REPORT, pip's installation report of the same
packages (``pip install --dry-run --no-deps --report``), gives each stand-in its extras: the
requirements an extra adds (``httpx[http2]`` asks for h2) are resolved like any other. A
stand-in's own unconditional requirements are left out: the host's set is taken as
consistent.
"""

from __future__ import annotations

import json
import re
import site
import sys
from pathlib import Path


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def main() -> None:
    freeze, out = Path(sys.argv[1]), Path(sys.argv[2]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    extras: dict[str, list[str]] = {}
    if len(sys.argv) > 3:
        for item in json.loads(Path(sys.argv[3]).read_text())["install"]:
            meta = item["metadata"]
            lines = [f"Provides-Extra: {e}" for e in meta.get("provides_extra") or []]
            lines += [
                f"Requires-Dist: {r}" for r in meta.get("requires_dist") or [] if "extra" in r
            ]
            extras[normal(meta["name"])] = lines
    count = 0
    for n, raw in enumerate(freeze.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            sys.exit(f"{freeze}:{n}: '{line[:80]}' is not name==version (pip list --format=freeze)")
        name, version = m.groups()
        info = out / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        head = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        (info / "METADATA").write_text("\n".join(head + extras.get(normal(name), [])) + "\n")
        (info / "INSTALLER").write_text("host-standin\n")
        (info / "RECORD").write_text("")
        count += 1
    Path(site.getsitepackages()[0], "llm-release-host-standins.pth").write_text(f"{out}\n")
    print(f"{count} host packages stood in under {out}")


if __name__ == "__main__":
    main()
