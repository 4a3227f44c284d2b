"""HAProxy in front of the stable release and the canary.

The config has two fixed server slots, ``stable`` and ``canary``, in one backend with
``balance roundrobin`` (weights are dynamic for it). Addresses, weights and drain state
change through HAProxy's runtime API on a unix socket, so a change never restarts the
proxy and never drops an in-flight request.

No request a client sent is lost to a release change (see ``render_config``): weights
change without touching connections, a server leaves the rotation by ``drain`` and is
stopped only once HAProxy and vLLM both count no request in flight on it, and a request
whose server refused the connection or died before answering is sent again to the other
server (L7 retries with redispatch).
"""

from __future__ import annotations

import csv
import io
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from llm_release import server_key
from llm_release.canary import door
from llm_release.errors import RouterError
from llm_release.fileio import atomic_write_text
from llm_release.hub.credentials import child_env
from llm_release.serving import processes
from llm_release.serving.serve import free_port
from llm_release.settings import settings

logger = logging.getLogger(__name__)

BACKEND = "releases"
SLOTS = ("stable", "canary")
# The canary's quality probes (quality.py): a request with this header names the slot that
# must answer it. Only the project's own key may pin; pinned requests go to a backend of
# their own, so HAProxy counts them apart from user traffic (proxy="probes"), and the
# answer names the slot that gave it.
PIN_HEADER = "X-LLM-Release-Pin"
ANSWERED_BY_HEADER = "X-LLM-Release-Answered-By"
PROBE_BACKEND = "probes"
# HAProxy needs an address for a slot that points nowhere yet; weight 0 + maint keeps it idle.
PARKED_ADDR = ("127.0.0.1", 9)
# HAProxy's own Prometheus exporter listens here (loopback only); unset: a free port, recorded
# in the router directory for as long as that HAProxy runs.
METRICS_PORT_ENV = "LLM_RELEASE_HAPROXY_METRICS_PORT"


BUFSIZE = 32768
RETRIES = 3
# A stopped server is out of the rotation within ~1.3 s: its first failed check (refused
# at once) makes it transitional, checked again after fastinter, and fall 2 takes it out.
# Retries cover the requests of that second; drain covers planned stops entirely.
CHECKS = "check inter 1s fastinter 250ms downinter 1s fall 2 rise 1"
# The answer to a request without a valid key (OpenAI's error shape; RFC 6750's challenge).
UNAUTHORIZED = (
    '{"error":{"message":"missing or invalid API key (Authorization: Bearer <key>)",'
    '"type":"invalid_request_error","code":"invalid_api_key"}}'
)
CHALLENGE = 'Bearer realm="llm-release"'
# Expanded by HAProxy from its environment when it reads the config (HAProxy 2.6
# configuration manual, 2.3: environment variables in double quotes).
SERVER_KEY_HEADER = f'    http-request set-header Authorization "Bearer ${{{server_key.KEY_ENV}}}"'
PIN_REFUSED = (
    '{"error":{"message":"only the canary probes of llm-release may send '
    + PIN_HEADER
    + '","type":"invalid_request_error","code":"pin_not_allowed"}}'
)


@dataclass(frozen=True)
class SlotTarget:
    host: str
    port: int
    weight: int


def render_config(
    *,
    listen_port: int,
    socket_path: Path,
    pid_path: Path,
    stable: SlotTarget | None,
    canary: SlotTarget | None,
    key_map: Path,
    metrics_port: int | None = None,
    public_bind: str | None = None,
    tls_pem: Path | None = None,
) -> str:
    """HAProxy's config. Every request needs an API key whose SHA-256 is in ``key_map``
    (see ``door``); ``public_bind`` adds a listener beside the loopback one, TLS with
    ``tls_pem``."""
    lines = [
        "global",
        f"    stats socket {socket_path} mode 600 level admin",
        f"    pidfile {pid_path}",
        # A request is retried only if all of it fits in one buffer (HAProxy 2.6 docs,
        # retry-on). 32 KiB holds a chat request up to the default max_model_len (2048
        # tokens at <= 12 bytes a token, JSON-escaped non-ASCII included); a larger one is
        # still served, just not retried. 2x the default buffer, so half the default
        # maxconn, as the docs ask; the service's peak is 50 concurrent users.
        f"    tune.bufsize {BUFSIZE}",
        "    maxconn 1024",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 600s",
        "    timeout server 600s",
        "    timeout http-request 30s",
        # A health check of a busy 2-core vLLM can take seconds; a stopped server still
        # fails its check at once (connection refused), so this delays nothing.
        "    timeout check 5s",
        "    option httplog",
        "",
        "frontend llm",
        f"    bind 127.0.0.1:{listen_port} name loopback",
    ]
    if public_bind is not None:
        tls = f" ssl crt {tls_pem} ssl-min-ver TLSv1.2" if tls_pem is not None else ""
        lines.append(f"    bind {door.haproxy_address(public_bind)} name public{tls}")
    lines += [
        # The door (door.py): the presented key's SHA-256 looked up in the map; the
        # project's own key opens the loopback listener only. A refusal is a 'deny', so
        # HAProxy counts it in the frontend's denied requests (dreq).
        f"    http-request set-var(txn.key_kind) http_auth_bearer,sha2(256),hex,map_str({key_map})",
        f"    acl operator_key var(txn.key_kind) -m str {door.OPERATOR}",
        f"    acl project_key var(txn.key_kind) -m str {door.PROJECT}",
        "    acl on_loopback so_name loopback",
        "    http-request deny status 401 content-type application/json "
        f"string '{UNAUTHORIZED}' hdr WWW-Authenticate '{CHALLENGE}' "
        "unless operator_key || project_key on_loopback",
        # Pinning a slot (the quality probes) is the project's alone: an operator's client
        # that sends the header is refused, not silently pinned or load-balanced.
        f"    acl pinned req.hdr({PIN_HEADER}) -m found",
        "    http-request deny status 403 content-type application/json "
        f"string '{PIN_REFUSED}' if pinned !project_key",
        f"    use_backend {PROBE_BACKEND} if pinned project_key on_loopback",
        f"    default_backend {BACKEND}",
        "",
        f"backend {BACKEND}",
        "    balance roundrobin",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        # The vLLM servers ask for the project's server key (llm_release.server_key): set
        # on every request sent to them, in place of the client's Authorization (the door's
        # key stays here). From HAProxy's environment, never written into this file.
        SERVER_KEY_HEADER,
        # One request per server connection, so HAProxy's per-server counters are requests.
        "    option http-server-close",
        # L7 retries, only where the client cannot have received anything, so a replay can
        # never hand it two answers, and a chat completion changes no server state (a
        # replay costs compute, not correctness):
        #   conn-failure    the connection was refused or failed: a stopped or crashed
        #                   server; the request never reached it.
        #   empty-response  the server closed the connection without a byte of answer: it
        #                   died mid-request, or its dying listener reset a connection it
        #                   had accepted but never read.
        #   503             the server refused the work (vLLM: engine dead, scaling) and
        #                   says "try elsewhere".
        # Not retried: response-timeout (the server may still be generating; a replay
        # doubles the load when the service is slowest, and after 'timeout server' the
        # client has usually given up, so the answer would reach nobody); junk-response
        # and 500 (often caused by the request itself: a replay carries the poison to the
        # other server). A streamed answer whose headers went out cannot be retried:
        # drain before stop is what protects it.
        "    retry-on conn-failure empty-response 503",
        f"    retries {RETRIES}",
        # Every retry goes to another server (roundrobin skips the one that failed), not
        # back to the dead one after a 1 s turn-around.
        "    option redispatch 1",
        # The whole request is read before a server is picked, so the copy a retry replays
        # is complete (a request still streaming its body in cannot be retried).
        "    option http-buffer-request",
    ]
    for name, target in (("stable", stable), ("canary", canary)):
        if target is None:
            host, port = PARKED_ADDR
            lines.append(f"    server {name} {host}:{port} weight 0 disabled {CHECKS}")
        else:
            lines.append(
                f"    server {name} {target.host}:{target.port} weight {target.weight} {CHECKS}"
            )
    lines += probe_backend(stable, canary)
    if metrics_port is not None:
        # Per-server counters (responses by class, connection and response errors) for
        # Prometheus; a frontend of its own so no client of the service can read them.
        lines += [
            "",
            "frontend metrics",
            f"    bind 127.0.0.1:{int(metrics_port)}",
            "    no log",
            # Prometheus sends the server key (its credentials_file); nobody else reads
            # the servers' counters.
            f'    acl scraper http_auth_bearer -m str -- "${{{server_key.KEY_ENV}}}"',
            "    http-request deny status 401 unless scraper",
            "    http-request use-service prometheus-exporter if { path /metrics }",
            "    http-request deny",
        ]
    return "\n".join(lines) + "\n"


def probe_backend(stable: SlotTarget | None, canary: SlotTarget | None) -> list[str]:
    """The backend of pinned requests: the same two servers, weight 0 so that load
    balancing never picks one; only ``use-server`` does. A pin to a parked or dead slot is
    answered 503 by HAProxy, never by the other slot; no retries, no redispatch."""
    lines = [
        "",
        f"backend {PROBE_BACKEND}",
        "    option http-server-close",
        SERVER_KEY_HEADER,
        f"    http-request deny status 400 unless {{ req.hdr({PIN_HEADER}) -m str {' '.join(SLOTS)} }}",
    ]
    lines += [
        f"    use-server {slot} if {{ req.hdr({PIN_HEADER}) -m str {slot} }}" for slot in SLOTS
    ]
    lines.append(f"    http-response set-header {ANSWERED_BY_HEADER} %[srv_name]")
    for name, target in (("stable", stable), ("canary", canary)):
        if target is None:
            host, port = PARKED_ADDR
            lines.append(f"    server {name} {host}:{port} weight 0 disabled")
        else:
            lines.append(f"    server {name} {target.host}:{target.port} weight 0")
    return lines


class Router:
    """Controls one HAProxy instance whose files live under ``directory``."""

    def __init__(
        self, directory: Path, listen_port: int, door_settings: door.DoorSettings | None = None
    ) -> None:
        """``door_settings``: the operator's (default: read from the environment at start)."""
        self.directory = Path(directory)
        self.listen_port = listen_port
        self.door_settings = door_settings
        self.socket_path = self.directory / "haproxy.sock"
        self.pid_path = self.directory / "haproxy.pid"
        self.config_path = self.directory / "haproxy.cfg"
        self.metrics_port_path = self.directory / "metrics-port"
        self.key_map_path = self.directory / "keys.map"
        self.api_key_path = self.directory / "client.key"

    @property
    def url(self) -> str:
        """The loopback listener: the project's own clients send through it."""
        return f"http://127.0.0.1:{self.listen_port}"

    @property
    def api_key(self) -> str:
        """The project's own API key (made on first use; opens the loopback listener), for
        a caller that sends it to ``url``: refused while another process than this HAProxy
        listens on the port (the record's ``router_port`` is input: edited to another local
        user's port, the probes and the demo traffic would hand that user the key)."""
        self.check_port()
        self.directory.mkdir(parents=True, exist_ok=True)
        return door.project_key(self.api_key_path)

    def check_port(self) -> None:
        """The loopback port is this HAProxy's (its master and workers) or free."""
        pid = self.pid()
        others = processes.foreign_listeners(
            self.listen_port, processes.tree(pid) if pid is not None else set()
        )
        if others:
            raise RouterError(
                f"the load balancer's port {self.listen_port} is held by {', '.join(others)}, "
                "not by this home's HAProxy: the project's key is not sent there",
                hint="check the record's router_port (make status), or stop what holds it",
            )

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def metrics_port(self) -> int | None:
        """The port of HAProxy's Prometheus exporter, as recorded when it started; None
        (logged) when another process than this HAProxy holds it: Prometheus scrapes it
        with the servers' key, and the file is a state file like any."""
        port = processes.read_int(self.metrics_port_path)
        pid = self.pid()
        if port is None or pid is None:
            return port
        others = processes.foreign_listeners(port, processes.tree(pid))
        if others or not 0 < port < 65536:
            logger.warning(
                "HAProxy's recorded metrics port %s is held by %s, not HAProxy: not scraped",
                port,
                ", ".join(others) or "nothing valid",
            )
            return None
        return port

    # -- process -------------------------------------------------------------------------
    def outdated(self) -> bool:
        """A running HAProxy whose config an older version wrote: it forwards requests
        without the servers' key (they would all be refused), so it is started again."""
        try:
            return SERVER_KEY_HEADER not in self.config_path.read_text("utf-8")
        except OSError:
            return True

    def pid(self) -> int | None:
        return processes.pid_from_file(self.pid_path, str(self.config_path))

    def running(self) -> bool:
        return self.pid() is not None and self.socket_path.exists()

    def start(self, stable: SlotTarget | None, canary: SlotTarget | None) -> None:
        binary = shutil.which("haproxy")
        if binary is None:
            raise RouterError(
                "haproxy is not installed",
                hint="run 'make setup' (it runs apt-get install -y haproxy) and try again",
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        # HAProxy refuses a unix socket path longer than sun_path (108 bytes).
        if len(str(self.socket_path)) > 100:
            raise RouterError(
                f"router directory path is too long for a unix socket: {self.socket_path}",
                hint="set LLM_RELEASE_HOME to a shorter path",
            )
        door_cfg = (self.door_settings or door.settings()).check()
        operator_keys = door.read_keys(door_cfg.keys_file) if door_cfg.keys_file else []
        # Hashes only; 0600 like every file atomic_write_text makes.
        atomic_write_text(self.key_map_path, door.render_key_map(operator_keys, self.api_key))
        metrics_port = settings().haproxy_metrics_port or free_port()
        config = render_config(
            listen_port=self.listen_port,
            socket_path=self.socket_path,
            pid_path=self.pid_path,
            stable=stable,
            canary=canary,
            key_map=self.key_map_path,
            metrics_port=metrics_port,
            public_bind=door_cfg.bind,
            tls_pem=door_cfg.tls_pem,
        )
        atomic_write_text(self.config_path, config)
        # The daemon inherits this environment for its lifetime: no hub tokens in it, the
        # servers' key (the config reads it from there).
        env = child_env() | {server_key.KEY_ENV: server_key.key()}
        check = subprocess.run(
            [binary, "-c", "-f", str(self.config_path)],
            capture_output=True,
            text=True,
            env=env,
        )
        if check.returncode != 0:
            raise RouterError(f"HAProxy rejected its config:\n{check.stderr.strip()}")
        proc = subprocess.run(
            [binary, "-D", "-f", str(self.config_path)],
            capture_output=True,
            text=True,
            env=env,
        )
        if proc.returncode != 0:
            raise RouterError(
                f"HAProxy did not start: {proc.stderr.strip()}",
                hint=f"is port {self.listen_port} (or the metrics port {metrics_port}"
                + (f", or {door_cfg.bind}" if door_cfg.bind else "")
                + f") already in use? set a different router port, {METRICS_PORT_ENV} or "
                f"{door.BIND_ENV}",
            )
        atomic_write_text(self.metrics_port_path, f"{metrics_port}\n")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.running():
                return
            time.sleep(0.05)
        raise RouterError("HAProxy started but its runtime socket never appeared")

    def stop(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
        self.socket_path.unlink(missing_ok=True)
        return True

    # -- runtime API -----------------------------------------------------------------------
    def command(self, line: str) -> str:
        if not self.socket_path.exists():
            raise RouterError(
                f"HAProxy runtime socket {self.socket_path} does not exist",
                hint="the router is not running; run a release or 'llm-release router start'",
            )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while data := sock.recv(65536):
                chunks.append(data)
        reply = b"".join(chunks).decode()
        stripped = reply.strip()
        if (
            stripped
            and not stripped.startswith("#")
            and any(marker in stripped for marker in ("Unknown", "No such", "Require", "invalid"))
        ):
            raise RouterError(f"HAProxy refused {line!r}: {stripped}")
        return reply

    def set_target(self, slot: str, target: SlotTarget | None) -> None:
        """Point ``slot`` at a server (or park it) and set its weight; no restart."""
        if slot not in SLOTS:
            raise RouterError(f"unknown slot {slot!r}; valid: {', '.join(SLOTS)}")
        server = f"{BACKEND}/{slot}"
        probe_server = f"{PROBE_BACKEND}/{slot}"
        if target is None:
            self.command(f"set server {server} weight 0")
            self.command(f"set server {server} state maint")
            self.command(f"set server {probe_server} state maint")
            return
        self.command(f"set server {probe_server} addr {target.host} port {target.port}")
        self.command(f"set server {probe_server} state ready")
        self.command(f"set server {server} addr {target.host} port {target.port}")
        self.command(f"set server {server} check-port {target.port}")
        self.command(f"set server {server} weight {target.weight}")
        self.command(f"set server {server} state ready")
        self.command(f"enable health {server}")
        # The pipeline points a slot only at a server it has seen answer (ready = /health
        # and one completion). A slot re-pointed from a stopped server is still DOWN until
        # its next check; if the other slot is parked in that second, HAProxy has no server
        # and answers 503 (one of 234 demo requests at a promotion, 2026-11-30). Checks go
        # on, and take it out again if it fails.
        self.command(f"set server {server} health up")

    def set_weight(self, slot: str, weight: int) -> None:
        self.command(f"set server {BACKEND}/{slot} weight {int(weight)}")

    def drain(self, slot: str) -> None:
        """Take ``slot`` out of the rotation: no new request, those in flight finish.

        Health checks go on, and set_target/'state ready' brings the slot back."""
        if slot not in SLOTS:
            raise RouterError(f"unknown slot {slot!r}; valid: {', '.join(SLOTS)}")
        self.command(f"set server {BACKEND}/{slot} state drain")

    def in_flight(self, slot: str, port: int | None = None) -> int:
        """Requests HAProxy has on ``slot`` now (its ``scur``).

        With ``port``, only while the slot still points at that port: a slot re-pointed at
        another server keeps counting the old server's requests with the new one's (a
        measured HAProxy 2.6 behaviour), so the old server's own count must come from it."""
        row = self.stats().get(slot)
        if row is None:
            return 0
        if port is not None and not row.get("addr", "").endswith(f":{port}"):
            return 0
        return int(row.get("scur") or 0)

    def stats(self) -> dict[str, dict[str, str]]:
        """HAProxy's own counters for each server slot (from ``show stat``)."""
        raw = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(io.StringIO(raw))
        return {
            row["svname"]: row
            for row in rows
            if row.get("pxname") == BACKEND and row.get("svname") in SLOTS
        }
