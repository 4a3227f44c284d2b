"""A release of the demo model measured on two hosts of the fleet at once, on this one
machine (issue 37, item 4; docs/fleet.md). Not a test: a benchmark-like run, one command:

    .venv/bin/python bench/fleet_release.py [--work DIR] [--runs one,two,kill]

What it starts (every process in a session of its own, every one stopped at the end, on
failure too): a PostgreSQL server on a unix socket (tests/pg.py), the project's Prefect
server on it (flows.server, LLM_RELEASE_PREFECT_DATABASE_URL), the demo hub (hub
publish-demo, hub serve) as the source and as the fleet's hub, then per run:

- ``one``: one host, outside a fleet: a worker on the pool's default queue, no
  LLM_RELEASE_HOST_NAME; the release through the ``release`` deployment (as make demo).
- ``two``: two hosts joined (python -m flows.fleet join, as make fleet-join): host_a (home:
  the release is sent to its queue, ``flows.release --deployment release/release --home
  host_a``) and host_b, each worker polling its own queue alone, each with its own LLM_RELEASE_HOME,
  router port and LLM_RELEASE_HOST_NAME, the record one PostgreSQL database, the demo hub
  as the fleet's hub (a HubCredentials block with its write token).
- ``kill``: ``two`` again, and host_b's worker process group (and every process of host_b's
  home: its vLLM runs in a session of its own) is SIGKILLed while it measures: the lost-run
  watch should crash that run and measure_on_host send the contender home again.

Each run gets a fresh record database and fresh homes (a first release each time: no
champion), the same config (configs/demo.json with the baseline and w4a16-awq, fewer eval
items and a lighter load: see CONFIG). Everything is written under the work folder; the
summary (summary.json) is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.pg import PORT as PG_PORT  # noqa: E402
from tests.pg import PostgresServer  # noqa: E402

PY = ROOT / ".venv" / "bin" / "python"
PREFECT = ROOT / ".venv" / "bin" / "prefect"
CLI = ROOT / ".venv" / "bin" / "llm-release"
DEMO_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
HOSTS = ("host_a", "host_b")  # host_a is home: the release runs there

# configs/demo.json with two contenders (the baseline and one quantized candidate) and a
# lighter measurement: 16 eval items a set, one load level of 8 requests. The candidate is
# W4A16 (AWQ, 16 calibration samples), not FP8: on this 2-core Xeon (AMX) vLLM CPU's FP8
# engine step stalled for minutes on the first eval request (docs/results.md saw it time
# out on 2026-12-02 too).
CONFIG = {
    "serving": {"enforce_eager": True, "max_model_len": 2048, "max_num_seqs": 8},
    "candidates": [{"name": "w4a16-awq", "scheme": "W4A16_AWQ", "num_calibration_samples": 16}],
    "evaluation": {"limit": 16},
    "load": {
        "concurrencies": [4],
        "requests_per_level": 8,
        "prompt_tokens": 128,
        "output_tokens": 32,
    },
    "gates": {"ttft_p95_slo_s": 6.0},
    "review": {"auto": "approve"},
    "rollout": {
        "steps": [25, 50, 100],
        "windows_per_step": 1,
        "approval": "approve",
        "approval_timeout_s": 300,
        "traffic": {"rate_rps": 2.0, "concurrency": 4, "max_tokens": 16},
        "analysis": {"window_s": 90, "latency_max_ratio": 1.5, "latency_slack_s": 0.5},
    },
}


def now() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S")


def say(msg: str) -> None:
    print(f"[{now()}] {msg}", flush=True)


class Bench:
    def __init__(self, work: Path, base_port: int) -> None:
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.prefect_port = base_port
        self.hub_port = base_port + 10
        self.router_ports = {
            "one": base_port + 20,
            "host_a": base_port + 21,
            "host_b": base_port + 22,
        }
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.homes: list[tuple[Path, dict]] = []
        self.pg: PostgresServer | None = None
        self.control = work / "control"  # the Prefect server's home (its credentials)
        self.hub_home = work / "hub"
        self.hub = f"http://127.0.0.1:{self.hub_port}"
        self.api = f"http://127.0.0.1:{self.prefect_port}/api"

    # ------------------------------------------------------------ processes
    def base_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PREFECT_", "LLM_RELEASE_", "HF_", "VIRTUAL_ENV"))
        }
        env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        env |= {
            "PREFECT_HOME": str(self.work / "prefect"),
            "PREFECT_LOGGING_EXTRA_LOGGERS": "llm_release",
            "LLM_RELEASE_PROJECT": str(ROOT),
            "LLM_RELEASE_PROBES": str(self.work / "probes"),
            "LLM_RELEASE_PROMETHEUS_PORT": "auto",
            "LLM_RELEASE_ALERTMANAGER_PORT": "auto",
            "LLM_RELEASE_HOME": str(self.control),
            "FLEET_RELEASE_WORK": str(self.work),  # marks every process this run started
        }
        return env

    def client_env(self) -> dict[str, str]:
        auth = (self.control / "prefect-api.auth").read_text().strip()
        return self.base_env() | {"PREFECT_API_URL": self.api, "PREFECT_API_AUTH_STRING": auth}

    def run(self, argv: list, env: dict, timeout: float = 600, log: str | None = None) -> str:
        out = subprocess.run(
            [str(a) for a in argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if log:
            (self.logs / log).write_text(out.stdout + out.stderr)
        if out.returncode != 0:
            raise RuntimeError(
                f"{' '.join(map(str, argv))[:200]} failed ({out.returncode}): "
                f"{(out.stdout + out.stderr)[-3000:]}"
            )
        return out.stdout

    def start(self, name: str, argv: list, env: dict, log: Path) -> subprocess.Popen:
        proc = subprocess.Popen(
            [str(a) for a in argv],
            cwd=ROOT,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def stop(self, proc: subprocess.Popen, grace_s: float = 15) -> None:
        if proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def marked(self, needle: str) -> list[int]:
        """Pids of processes (not this one) whose command line or environment names
        ``needle`` (a path under the work folder)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes()
                envb = (entry / "environ").read_bytes()
            except OSError:
                continue
            if needle.encode() in cmd or needle.encode() in envb:
                found.append(int(entry.name))
        return found

    def kill_marked(self, needle: str) -> list[int]:
        pids = self.marked(needle)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def down(self, home: Path, env: dict) -> None:
        """What a release left serving from ``home`` (vLLM, router, Prometheus, Alertmanager)."""
        try:
            self.run([CLI, "down"], env | {"LLM_RELEASE_HOME": str(home)}, timeout=180)
        except Exception as exc:  # noqa: BLE001 - cleanup goes on
            say(f"llm-release down for {home}: {exc}"[:300])

    # ------------------------------------------------------------ infrastructure
    def up(self) -> None:
        say("PostgreSQL (tests/pg.py: a unix socket, no TCP port)")
        self.pg = PostgresServer.start()
        prefect_db = self.database("prefect")
        say(f"the demo hub on :{self.hub_port}")
        env = self.base_env() | {"LLM_RELEASE_HOME": str(self.hub_home)}
        self.run([CLI, "hub", "publish-demo"], env, timeout=900, log="hub-publish.log")
        self.start(
            "hub", [CLI, "hub", "serve", "--port", self.hub_port], env, self.logs / "hub.log"
        )
        self.wait_http(f"{self.hub}/api/models/{DEMO_REPO}", 60)
        self.hub_token = (self.hub_home / "hub.token").read_text().strip()
        say(f"the Prefect server on :{self.prefect_port}, on PostgreSQL")
        env = self.base_env() | {"LLM_RELEASE_PREFECT_DATABASE_URL": prefect_db}
        self.control.mkdir(parents=True, exist_ok=True)
        self.run(
            [PY, "-m", "flows.server", "--port", self.prefect_port]
            + ["--log", self.logs / "prefect-server.log", "--pid-file", self.work / "prefect.pid"],
            env,
            timeout=300,
            log="prefect-up.log",
        )
        env = self.client_env()
        self.run([PY, "-m", "flows.control"], env, timeout=300, log="prefect-control.log")
        subprocess.run(
            [PREFECT, "work-pool", "create", "llm-release", "--type", "process"],
            cwd=ROOT,
            env=env,
            capture_output=True,
        )
        self.run(
            [PREFECT, "--no-prompt", "deploy", "--name", "release", "--name", "measure"],
            env,
            timeout=600,
            log="deploy.log",
        )
        code = (
            "import sys; from blocks.hub import HubCredentials; "
            "HubCredentials(endpoint=sys.argv[1], token=sys.argv[2]).save('fleet-hub', "
            "overwrite=True)"
        )
        self.run([PY, "-c", code, self.hub, self.hub_token], env, timeout=120)

    def database(self, prefix: str) -> str:
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(
            host=str(self.pg.root),
            port=PG_PORT,
            user="postgres",
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.pg.url(name)

    def wait_http(self, url: str, limit_s: float) -> None:
        import requests

        ends = time.monotonic() + limit_s
        while time.monotonic() < ends:
            try:
                if requests.get(url, timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{url} did not answer in {limit_s} s")

    def teardown(self) -> None:
        say("cleanup")
        for home, env in self.homes:
            self.down(home, env)
        for _, proc in reversed(self.procs):
            self.stop(proc)
        pid_file = self.work / "prefect.pid"
        if pid_file.exists():
            try:
                os.killpg(int(pid_file.read_text().split()[0]), signal.SIGTERM)
                time.sleep(3)
                os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass
        left = self.kill_marked(str(self.work))
        if left:
            say(f"killed {len(left)} leftover process(es) of this run: {left}")
        if self.pg is not None:
            self.pg.stop()

    # ------------------------------------------------------------ one release
    def release(self, label: str, fleet: bool, kill: bool = False) -> dict:
        say(f"== run {label}: {'two hosts' if fleet else 'one host'}{', kill' if kill else ''}")
        run_root = self.work / label
        run_root.mkdir(parents=True, exist_ok=True)
        record = self.database(f"record_{label}")
        config = CONFIG | {"source": {"repo_id": DEMO_REPO, "endpoint": self.hub}}
        config_path = run_root / "config.json"
        config_path.write_text(json.dumps(config, indent=1))
        client = self.client_env()
        common = client | {"LLM_RELEASE_DATABASE_URL": record, "PREFECT_WORKER_QUERY_SECONDS": "3"}
        workers: dict[str, subprocess.Popen] = {}
        homes: dict[str, Path] = {}
        if fleet:
            common |= {
                "LLM_RELEASE_FLEET_HUB_ENDPOINT": self.hub,
                "LLM_RELEASE_FLEET_HUB_ORG": "fleet",
                "LLM_RELEASE_FLEET_HUB_CREDENTIALS": "fleet-hub",
            }
            for host in HOSTS:
                homes[host] = run_root / host
                env = common | {
                    "LLM_RELEASE_HOME": str(homes[host]),
                    "LLM_RELEASE_HOST_NAME": host,
                    "LLM_RELEASE_ROUTER_PORT": str(self.router_ports[host]),
                }
                homes[host].mkdir(parents=True, exist_ok=True)
                self.homes.append((homes[host], env))
                # make fleet-join HOST=host: the card, the queue, the slots, the watch
                self.run(
                    [PY, "-m", "flows.fleet", "join", host], env, log=f"{label}-join-{host}.log"
                )
                queues = ["--work-queue", f"host-{host}"]  # home's takes the release (--home)
                workers[host] = self.start(
                    f"worker-{label}-{host}",
                    [PREFECT, "worker", "start", "--pool", "llm-release", *queues, "--name", host],
                    env,
                    run_root / f"worker-{host}.log",
                )
            home = homes[HOSTS[0]]
            release_env = common | {
                "LLM_RELEASE_HOME": str(home),
                "LLM_RELEASE_HOST_NAME": HOSTS[0],
            }
        else:
            home = homes["one"] = run_root / "host"
            home.mkdir(parents=True, exist_ok=True)
            env = common | {
                "LLM_RELEASE_HOME": str(home),
                "LLM_RELEASE_ROUTER_PORT": str(self.router_ports["one"]),
            }
            self.homes.append((home, env))
            workers["one"] = self.start(
                f"worker-{label}",
                [PREFECT, "worker", "start", "--pool", "llm-release", "--work-queue", "default"]
                + ["--name", f"solo-{label}"],
                env,
                run_root / "worker-one.log",
            )
            release_env = env
        time.sleep(8)  # the workers poll (and, in a fleet, show ONLINE)
        if fleet:
            listing = self.run(
                [PY, "-m", "flows.fleet", "list"], release_env, log=f"{label}-fleet.log"
            )
            (run_root / "fleet-list.txt").write_text(listing)
        killer = None
        kill_info: dict = {}
        if kill:
            killer = threading.Thread(
                target=self.kill_when_measuring,
                args=(client, homes[HOSTS[1]], workers[HOSTS[1]], kill_info),
                daemon=True,
            )
            killer.start()
        output = run_root / "result.json"
        started = time.monotonic()
        proc = subprocess.run(
            [PY, "-m", "flows.release", "--deployment", "release/release"]
            + ["--hub-endpoint", self.hub, "--config", config_path, "--output", output]
            + ["--deployment-timeout-s", "5400"]
            + (["--home", HOSTS[0]] if fleet else []),
            cwd=ROOT,
            env={k: str(v) for k, v in release_env.items()},
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - started
        (run_root / "release-cli.log").write_text(proc.stdout + proc.stderr)
        say(f"run {label}: exit {proc.returncode} after {wall:.0f} s")
        if killer is not None:
            killer.join(timeout=5)
        summary = {
            "label": label,
            "hosts": list(HOSTS) if fleet else ["(one host, no fleet)"],
            "exit": proc.returncode,
            "wall_s": round(wall, 1),
            "record": "postgresql (fresh database)",
        }
        if kill:
            summary["kill"] = kill_info
        if proc.returncode == 0 and output.exists():
            result = json.loads(output.read_text())
            report = Path(result["report"]).read_text()
            (run_root / "report.md").write_text(report)
            summary |= {
                "run_id": result["run_id"],
                "winner": result["winner"],
                "stable": result["stable"],
                "verdict": result["verdict"],
                "summary": result["summary"],
                "stage_seconds": result["stage_seconds"],
                "failed": result.get("failed"),
                "gates": section(report, "## Gates"),
                "candidates": section(report, "## Candidates"),
                "measured_on": re.findall(r"\*(\S+): measured on fleet host (\S+?)\.\*", report),
                "lost": re.findall(r"\*(\S+): an attempt was lost: (.*?)\.\*\n", report),
                "eligibility": re.findall(r"^### (\S+) — (.+)$", report, re.M),
            }
            summary["measure_runs"] = self.measure_runs(client, result["run_id"])
        else:
            summary["error"] = (proc.stdout + proc.stderr)[-2000:]
        # what this run left: served releases, workers
        for p in homes.values():
            self.down(p, release_env | {"LLM_RELEASE_HOME": str(p)})
        for w in workers.values():
            self.stop(w)
        for h, p in homes.items():
            left = self.kill_marked(str(p))
            if left:
                say(f"run {label}: killed {len(left)} leftover process(es) of {h}")
        (run_root / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary

    def kill_when_measuring(self, env, home_b: Path, worker: subprocess.Popen, info: dict) -> None:
        """SIGKILL host_b's worker process group, and every process of its home, once its
        measure run is Running and its vLLM has started."""
        try:
            ends = time.monotonic() + 3600
            while time.monotonic() < ends:
                logs = list(home_b.glob("runs/*/candidates/*/vllm.log"))
                if logs:
                    break
                time.sleep(2)
            else:
                info["error"] = "host_b never started a vLLM"
                return
            time.sleep(20)  # measuring: vLLM starting, the run beating
            info["vllm_log"] = str(logs[0].relative_to(home_b))
            info["runs_before"] = self.measure_runs(env, None)
            info["killed_at"] = datetime.now(UTC).isoformat(timespec="seconds")
            os.killpg(worker.pid, signal.SIGKILL)
            others = self.kill_marked(str(home_b))  # its vLLM: a session of its own
            info["killed"] = (
                f"worker process group {worker.pid} and {len(others)} process(es) of host_b's home"
            )
            say(f"kill: {info['killed']}")
        except Exception as exc:  # noqa: BLE001
            info["error"] = repr(exc)

    def measure_runs(self, env: dict, run_id: str | None) -> list[dict]:
        code = """
import json, sys
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName
run_id = sys.argv[1] if len(sys.argv) > 1 else None
with get_client(sync_client=True) as c:
    runs = c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["measure"])))
out = []
for r in runs:
    order = (r.parameters or {}).get("order") or {}
    if run_id and order.get("run_id") != run_id:
        continue
    out.append({"name": r.name, "queue": r.work_queue_name, "state": r.state.name if r.state else None,
                "message": (r.state.message or "")[:300] if r.state else "",
                "contender": (order.get("contender") or {}).get("name"), "run_id": order.get("run_id"),
                "start": r.start_time.isoformat() if r.start_time else None,
                "end": r.end_time.isoformat() if r.end_time else None})
print(json.dumps(sorted(out, key=lambda x: x["start"] or "")))
"""
        try:
            out = self.run([PY, "-c", code, *([run_id] if run_id else [])], env, timeout=120)
            return json.loads(out.strip().splitlines()[-1])
        except Exception as exc:  # noqa: BLE001
            return [{"error": str(exc)[:300]}]


def section(report: str, title: str) -> str:
    lines, keep = [], False
    for line in report.splitlines():
        if line.startswith("## "):
            keep = line == title
        if keep:
            lines.append(line)
    return "\n".join(lines).strip()


def decision_key(s: dict) -> tuple:
    return (
        s.get("winner"),
        s.get("stable"),
        s.get("verdict"),
        tuple(map(tuple, s.get("eligibility", []))),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    parser.add_argument("--work", type=Path, default=Path(f"/tmp/fleet-release-{stamp}"))
    parser.add_argument("--runs", default="one,two,kill")
    parser.add_argument("--base-port", type=int, default=4300)
    args = parser.parse_args()
    # stopped by SIGTERM or SIGINT (even from a shell that ignores SIGINT in background
    # jobs): the cleanup below runs
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    say(f"work folder: {work}")
    bench = Bench(work, args.base_port)
    runs = []
    started = time.monotonic()
    try:
        bench.up()
        for label in [x for x in args.runs.split(",") if x]:
            try:
                runs.append(bench.release(label, fleet=label != "one", kill=label == "kill"))
            except Exception:  # noqa: BLE001 - the next run still goes
                runs.append({"label": label, "error": traceback.format_exc()[-2000:]})
                say(f"run {label} broke:\n{traceback.format_exc()[-1500:]}")
    finally:
        bench.teardown()
    keys = {r["label"]: decision_key(r) for r in runs if "winner" in r}
    summary = {
        "work": str(work),
        "total_s": round(time.monotonic() - started, 1),
        "same_decision": len(set(keys.values())) == 1 if keys else None,
        "runs": [
            {
                k: r.get(k)
                for k in (
                    "label",
                    "exit",
                    "wall_s",
                    "winner",
                    "stable",
                    "verdict",
                    "summary",
                    "eligibility",
                    "measured_on",
                    "lost",
                    "kill",
                    "measure_runs",
                    "error",
                )
            }
            for r in runs
        ],
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0 if all(r.get("exit") == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
