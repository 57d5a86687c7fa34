"""The parts of ``test_fleet``'s scene that are not gpudiag: a counter exporter whose value the
test sets (a scheduler's counter, reset at will), an auth proxy that wants a bearer token under
a route prefix (as a platform puts one in front of Prometheus), a bcrypt hash for Prometheus'
``--web.config.file`` and a self-signed TLS certificate.

bcrypt comes from the system's libcrypt (libxcrypt, ``crypt_gensalt``/``crypt``), so the test
adds no Python dependency; Prometheus checks the hash with Go's bcrypt.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import http.server
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

from tests.harness import free_port


class CounterExporter:
    """Serves ``/metrics`` with one counter whose value the test sets: set it lower and
    Prometheus sees a reset, as when the process behind a counter restarts."""

    def __init__(self, name: str, labels: str) -> None:
        self.value = 0.0
        self.port = free_port()
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = f"# TYPE {name} counter\n{name}{{{labels}}} {me.value}\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.server.socket.fileno() >= 0:
            self.server.shutdown()
            self.server.server_close()


class BearerProxy:
    """Forwards ``PREFIX/...`` to ``upstream`` for requests with ``Authorization: Bearer
    TOKEN``: 401 without it, 404 outside the prefix (Prometheus under a route prefix)."""

    def __init__(self, upstream: str, token: str, prefix: str = "/prom") -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.seen_auth: list[str] = []

        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                auth = self.headers.get("Authorization", "")
                me.seen_auth.append(auth)
                if not self.path.startswith(prefix + "/"):
                    return self._reply(404, b"404 page not found\n")
                if auth != f"Bearer {token}":
                    return self._reply(401, b"Unauthorized\n")
                try:
                    with urllib.request.urlopen(upstream + self.path[len(prefix):], timeout=60) as r:  # noqa: S310
                        return self._reply(r.status, r.read(), r.headers.get("Content-Type", ""))
                except urllib.error.HTTPError as e:
                    return self._reply(e.code, e.read(), e.headers.get("Content-Type", ""))

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.server.socket.fileno() >= 0:
            self.server.shutdown()
            self.server.server_close()


def bcrypt_hash(password: str, cost: int = 4) -> str:
    """A ``$2b$`` hash from the system's libcrypt (cost 4: the cheapest, checked per request)."""
    lib = ctypes.CDLL(ctypes.util.find_library("crypt") or "libcrypt.so.1")
    lib.crypt_gensalt.restype = ctypes.c_char_p
    lib.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    salt = lib.crypt_gensalt(b"$2b$", cost, None, 0)
    out = lib.crypt(password.encode(), salt)
    assert out and out.startswith(b"$2b$"), "libcrypt made no bcrypt hash"
    return out.decode()


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, made by openssl: the certificate is its own CA."""
    crt, key = folder / "server.crt", folder / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(crt), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return crt, key


def web_config(folder: Path, user: str, password: str) -> tuple[Path, Path]:
    """Prometheus' ``--web.config.file``: TLS with a self-signed certificate and one basic
    auth user, the password bcrypt-hashed. (the file, the certificate to trust)"""
    crt, key = self_signed(folder)
    cfg = folder / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
                   f"basic_auth_users:\n  {user}: '{bcrypt_hash(password)}'\n")
    return cfg, crt
