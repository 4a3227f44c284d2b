"""The project's own Prometheus exporters (a supervisor's, a container's metrics process)
behind the servers' key: prometheus_client's WSGI app, served on 127.0.0.1 as its
``start_http_server`` serves it, answering only ``Authorization: Bearer <key>``
(``llm_release.server_key``; Prometheus sends it from its credentials_file). Its own
server has no hook for a credential but client certificates, hence this wrapper."""

from __future__ import annotations

import hashlib
import hmac
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

REFUSED = b"this exporter asks for the project's key (Authorization: Bearer <key>)\n"


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # as prometheus_client's own handler
        pass


def locked(app, key: str):
    """``app`` answering only ``Bearer <key>``; an empty key opens nothing."""
    expected = hashlib.sha256(f"Bearer {key}".encode()).digest() if key else None

    def guarded(environ, start_response):
        presented = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if expected is None or not hmac.compare_digest(
            hashlib.sha256(presented).digest(), expected
        ):
            start_response(
                "401 Unauthorized",
                [
                    ("Content-Type", "text/plain"),
                    ("WWW-Authenticate", 'Bearer realm="llm-release"'),
                    ("Content-Length", str(len(REFUSED))),
                ],
            )
            return [REFUSED]
        return app(environ, start_response)

    return guarded


def serve(port: int, registry, key: str):
    """Serve ``registry`` on 127.0.0.1:``port`` in a daemon thread; the server is returned
    (``shutdown()`` stops it)."""
    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    httpd = make_server(
        "127.0.0.1",
        int(port),
        locked(make_wsgi_app(registry), key),
        ThreadingWSGIServer,
        handler_class=_Quiet,
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
