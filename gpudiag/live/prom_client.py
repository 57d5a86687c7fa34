"""Prometheus' HTTP API as platforms serve it: behind basic auth or a bearer token, over https
with a private CA, under a route prefix. The only place gpudiag holds a Prometheus credential.

Why credentials come from files (``--prometheus-password-file``, ``--bearer-token-file``) and
never from a flag's value: a value on the command line is in ``ps``, the shell's history and
CI logs. Prometheus' own clients do the same (``basic_auth.password_file``,
``authorization.credentials_file`` in its scrape and remote-write configs). A URL that carries
``user:password@`` is taken apart here: the password goes into the header, the URL shown
anywhere (errors, the page, its links, the JSON) is ``Prometheus.base``, which never holds one.

The Authorization header is sent as an *unredirected* header: a redirect to another host does
not carry it there. Every error is one line naming the cause the status says (401: the
credentials; 404: the route prefix; a TLS failure: --ca-file), never the credentials.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from gpudiag import contract as c
from gpudiag.durations import prom_duration
from gpudiag.errors import BadInput, GpudiagError
from gpudiag.scrape import fetch

MAX_ANSWER_BYTES = 256 * 1024 * 1024
MAX_SECRET_BYTES = 64 * 1024
CREDENTIAL_HINT = ("give --prometheus-user with --prometheus-password-file, or --bearer-token-file "
                   f"(or {c.ENV_PROMETHEUS_USER}, {c.ENV_PROMETHEUS_PASSWORD_FILE}, "
                   f"{c.ENV_PROMETHEUS_TOKEN_FILE})")


class PrometheusUnavailable(GpudiagError):
    """Prometheus did not answer, refused, or answered something that is not its API."""

    exit_code = 1


@dataclass(frozen=True)
class PromAuth:
    """How to reach Prometheus. ``repr`` never shows a secret."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    ca_file: Path | None = None
    insecure: bool = False

    @property
    def given(self) -> bool:
        return self.user is not None or self.token is not None

    def header(self) -> str | None:
        if self.token is not None:
            return f"Bearer {self.token}"
        if self.user is not None:
            pair = f"{self.user}:{self.password or ''}".encode()
            return "Basic " + base64.b64encode(pair).decode("ascii")
        return None


def read_secret(path: Path, option: str) -> str:
    """A password or token file's first line (as Prometheus reads ``password_file``: the whole
    file less its trailing newline). The error names the file, never its content."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SECRET_BYTES + 1)
    except OSError as e:
        raise BadInput(f"{option} {path}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_SECRET_BYTES:
        raise BadInput(f"{option} {path}: larger than {MAX_SECRET_BYTES} bytes; is it the right file?")
    text = raw.decode("utf-8", "replace").rstrip("\r\n")
    if not text or "\n" in text:
        raise BadInput(f"{option} {path}: expected one line (the secret alone), found "
                       f"{'nothing' if not text else 'several lines'}")
    return text


def split_url(url: str) -> tuple[str, str | None, str | None]:
    """(the base URL without credentials, user, password) of ``--prometheus``. A bare
    ``host:port`` is http. A query or fragment is refused: a credential hiding there would be
    shown everywhere the URL is."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        u = urllib.parse.urlsplit(text)
        port = u.port
    except ValueError as e:
        raise BadInput(f"--prometheus: not a URL ({e}); use e.g. http://prometheus:9090") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise BadInput("--prometheus: use an http:// or https:// URL, e.g. http://prometheus:9090")
    if u.query or u.fragment:
        raise BadInput("--prometheus: the URL has a query or fragment; give the server's base URL "
                       f"(a token goes in --bearer-token-file or {c.ENV_PROMETHEUS_TOKEN_FILE})")
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    netloc = host + (f":{port}" if port is not None else "")
    base = urllib.parse.urlunsplit((u.scheme, netloc, u.path.rstrip("/"), "", ""))
    user = urllib.parse.unquote(u.username) if u.username is not None else None
    password = urllib.parse.unquote(u.password) if u.password is not None else None
    return base, user, password


def resolve_auth(url: str, user: str | None, password_file: Path | None, token_file: Path | None,
                 ca_file: Path | None, insecure: bool) -> tuple[str, PromAuth]:
    """The base URL shown everywhere and the credentials, from the command's options; BadInput
    on a combination that cannot be meant (two ways to log in, half of one)."""
    base, url_user, url_password = split_url(url)
    if url_user is not None and (user is not None or password_file is not None or token_file is not None):
        raise BadInput("--prometheus carries a user in its URL and credentials are given as options "
                       "too: give them one way (the options keep them out of shell history)")
    if token_file is not None and (user is not None or password_file is not None):
        raise BadInput("--bearer-token-file and --prometheus-user: give one way to log in, not both")
    if (user is None) != (password_file is None) and url_user is None:
        raise BadInput("--prometheus-user and --prometheus-password-file go together: give both")
    if ca_file is not None and not Path(ca_file).is_file():
        raise BadInput(f"--ca-file {ca_file}: no such file")
    if url_user is not None:
        auth = PromAuth(url_user, url_password or "", None, ca_file, insecure)
    elif token_file is not None:
        auth = PromAuth(None, None, read_secret(token_file, "--bearer-token-file"), ca_file, insecure)
    elif user is not None and password_file is not None:
        auth = PromAuth(user, read_secret(password_file, "--prometheus-password-file"), None, ca_file,
                        insecure)
    else:
        auth = PromAuth(None, None, None, ca_file, insecure)
    return base, auth


class Prometheus:
    """GET requests to one Prometheus' API; ``base`` (no credentials) is what may be shown."""

    def __init__(self, base: str, auth: PromAuth | None = None) -> None:
        self.base = base.rstrip("/")
        self.auth = auth or PromAuth()
        handlers: list[urllib.request.BaseHandler] = []
        if self.base.startswith("https://"):
            ctx = ssl.create_default_context(cafile=str(self.auth.ca_file) if self.auth.ca_file else None)
            if self.auth.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        self._opener = urllib.request.build_opener(*handlers)

    def get(self, path: str, params: dict[str, str], timeout: float) -> object:
        """``data`` of a successful ``/api/v1/...`` answer; PrometheusUnavailable otherwise."""
        return self.data(self.get_raw(path, params, timeout))

    def get_raw(self, path: str, params: dict[str, str], timeout: float) -> bytes:
        """The answer's bytes, undecoded (``fleet_query`` decodes a range answer straight into
        floats: msgspec, several times faster than ``json`` on answers of 10,000 jobs), read by
        gpudiag's one HTTP reader (``gpudiag/scrape.py``); every failure to get them is
        PrometheusUnavailable with its one line."""
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        header = self.auth.header()
        if header is not None:
            req.add_unredirected_header("Authorization", header)
        try:
            return fetch(req, timeout, MAX_ANSWER_BYTES, self._opener)
        except ValueError as e:      # larger than MAX_ANSWER_BYTES: refused, never cut and half-read
            what = "give a shorter range" if "larger than" in str(e) else "check --prometheus"
            raise PrometheusUnavailable(f"Prometheus at {self.base}: {e}; {what}") from None
        except urllib.error.HTTPError as e:
            raise PrometheusUnavailable(self._http_error(e, path)) from None
        except ssl.SSLError as e:
            raise PrometheusUnavailable(self._tls_error(e)) from None
        except (OSError, urllib.error.URLError) as e:
            reason = getattr(e, "reason", None) or e
            if isinstance(reason, ssl.SSLError):
                raise PrometheusUnavailable(self._tls_error(reason)) from None
            raise PrometheusUnavailable(f"Prometheus at {self.base} did not answer: {reason}; "
                                        "check --prometheus") from None

    def data(self, raw: bytes) -> object:
        """``data`` of an answer's bytes if it says success; PrometheusUnavailable otherwise."""
        try:
            doc = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise PrometheusUnavailable(f"{self.base} answered, but not with Prometheus' JSON API (a "
                                        "login page or a proxy?); check --prometheus") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error", "") if isinstance(doc, dict) else ""
            raise PrometheusUnavailable(f"Prometheus at {self.base} failed a query: "
                                        f"{err or 'no error given'}")
        return doc.get("data")

    def _http_error(self, e: urllib.error.HTTPError, path: str) -> str:
        try:
            body = e.read(65536).decode("utf-8", "replace")
        except OSError:
            body = ""
        try:
            detail = str(json.loads(body).get("error", ""))
        except (ValueError, AttributeError):
            detail = body.strip().splitlines()[0][:200] if body.strip() else ""
        where = f"Prometheus at {self.base}"
        if e.code == 401:
            if self.auth.given:
                return (f"{where} refused the credentials given (HTTP 401): check the user and "
                        "password file, or the token file")
            return f"{where} asks for credentials (HTTP 401): {CREDENTIAL_HINT}"
        if e.code == 403:
            return f"{where} refused access (HTTP 403): these credentials may not query it"
        if e.code == 404:
            return (f"no Prometheus API at {self.base}{path} (HTTP 404): if Prometheus serves under a "
                    "route prefix (--web.route-prefix, or --web.external-url with a path), include it, "
                    "e.g. http://host:9090/prometheus")
        if e.code == 400 and "HTTPS server" in body:
            return f"{where} speaks https: use https:// in --prometheus"
        return f"{where} refused a query (HTTP {e.code}{': ' + detail if detail else ''})"

    def _tls_error(self, e: ssl.SSLError) -> str:
        what = getattr(e, "reason", None) or e.__class__.__name__
        if isinstance(e, ssl.SSLCertVerificationError):
            return (f"Prometheus at {self.base}: its TLS certificate is not trusted ({e.verify_message}): "
                    "give --ca-file with the CA that signed it, or --insecure to skip the check")
        if what == "WRONG_VERSION_NUMBER":
            return f"Prometheus at {self.base} does not speak TLS: use http:// in --prometheus"
        return f"Prometheus at {self.base}: TLS failed ({what})"

    # -- the calls gpudiag makes ------------------------------------------------------------
    def version(self, timeout: float) -> str:
        """The server's version ("" where it does not say: a proxy, Thanos)."""
        try:
            data = self.get("/api/v1/status/buildinfo", {}, timeout)
        except PrometheusUnavailable as e:
            if "HTTP 404" in str(e) and "buildinfo" in str(e):
                return ""
            raise
        return str(data.get("version", "")) if isinstance(data, dict) else ""

    def scrape_intervals(self, timeout: float) -> dict[str, float]:
        """instance -> the seconds between its scrapes, for every active target ({} where the
        server has no targets API, e.g. behind a federating proxy)."""
        try:
            data = self.get("/api/v1/targets", {"state": "active"}, timeout)
        except PrometheusUnavailable as e:
            if "HTTP 404" in str(e):
                return {}
            raise
        out: dict[str, float] = {}
        for t in (data or {}).get("activeTargets", []) if isinstance(data, dict) else []:
            inst = (t.get("labels") or {}).get("instance")
            secs = prom_duration(str(t.get("scrapeInterval", "")))
            if inst and secs:
                out[inst] = secs
        return out

