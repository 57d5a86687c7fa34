"""Open a page in a real headless Chromium and report what a person (and an attacker) would see.

Chromium is driven over its DevTools protocol (CDP) with the ``websocket-client`` package: one
websocket to the browser, one flattened CDP session per page. Only long-stable CDP domains are
used (Target, Page, Runtime, Log, Network), so Debian's Chromium may move a major version under
us without breaking this. Per page we record

- every JavaScript dialog (alert/confirm/prompt), dismissed at once so the page never blocks;
- console messages (``console.*`` and browser log entries such as failed loads) and uncaught
  exceptions;
- every network request the page made (``file://``, ``data:``, ``http(s)://``, websockets) and
  every page or popup it tried to open;
- each ``svg.chart``: its box on the page, its ``<title>``, and how many marks it draws;
- the visible text (``innerText``), the ``<script>`` elements, any ``on*`` attributes, the
  embedded ``#gpudiag-data`` JSON as parsed by the page, and a full-page PNG screenshot.

    with Chromium.launch(tmp_dir) as browser:
        page = browser.open(Path("report.html"))
        assert not page.dialogs and page.requests == [page.url]
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("GPUDIAG_CHROMIUM", "/usr/bin/chromium")
INSTALL_HINT = ("install Debian's chromium (apt-get update && apt-get install -y chromium), "
                "as .ci/run does, or point GPUDIAG_CHROMIUM at a Chromium binary")

# The flags every run uses: no sandbox (we run as root in CI), no GPU, nothing phoning home.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-sync",
    "--disable-component-update",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-port=0",
]

# Shapes that draw something in an SVG chart.
MARKS = "rect,path,circle,line,polyline,polygon,ellipse"

_PAGE_SCRIPT = """(() => {
  const MARKS = __MARKS__;
  const visible = el => {
    const s = getComputedStyle(el);
    if (s.display === 'none' || s.visibility === 'hidden' || parseFloat(s.opacity) === 0) return false;
    const r = el.getBoundingClientRect();
    return r.width > 0 || r.height > 0;
  };
  const charts = [...document.querySelectorAll('svg.chart')].map(svg => {
    const r = svg.getBoundingClientRect();
    const title = svg.querySelector(':scope > title');
    const sec = svg.closest('section');
    const marks = [...svg.querySelectorAll(MARKS)];
    return {
      title: title ? title.textContent : null,
      section: sec ? sec.id : null,
      x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height,
      marks: marks.length, visible_marks: marks.filter(visible).length,
    };
  });
  const el = document.scrollingElement || document.documentElement;
  const blob = document.getElementById('gpudiag-data');
  let data = null, data_error = null;
  try { data = blob ? JSON.parse(blob.textContent) : null; } catch (e) { data_error = String(e); }
  return {
    data, data_error,
    url: location.href,
    title: document.title,
    text: document.body ? document.body.innerText : '',
    charts,
    sections: [...document.querySelectorAll('section[id]')].map(s => s.id),
    scripts: [...document.scripts].map(s => ({type: s.type, id: s.id})),
    event_handler_attrs: [...document.querySelectorAll('*')].flatMap(
      e => [...e.attributes].filter(a => a.name.startsWith('on')).map(a => e.tagName + '@' + a.name)),
    // boxes whose content is wider than the box (cut off, or behind a sideways scrollbar);
    // ellipsised cells (text-overflow: ellipsis) are cut on purpose and left out
    clipped_boxes: [...document.body.querySelectorAll('*')].filter(e => {
      const s = getComputedStyle(e);
      return e.scrollWidth > e.clientWidth + 1 && s.overflowX !== 'visible' && s.textOverflow !== 'ellipsis';
    }).map(e => ({tag: e.tagName.toLowerCase(), id: e.id, cls: e.className && String(e.className),
                  scroll_width: e.scrollWidth, client_width: e.clientWidth,
                  text: (e.innerText || '').slice(0, 80)})),
    scroll_width: el.scrollWidth, client_width: el.clientWidth,
    page_width: el.scrollWidth, page_height: el.scrollHeight,
  };
})()""".replace("__MARKS__", json.dumps(MARKS))


class BrowserError(RuntimeError):
    """Chromium is missing, did not start, or did not answer."""


@dataclass
class Page:
    """What one page did and showed."""

    url: str
    final_url: str = ""
    title: str = ""
    dialogs: list[str] = field(default_factory=list)  # "alert: 1"
    console: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    page_errors: list[str] = field(default_factory=list)  # uncaught exceptions
    requests: list[str] = field(default_factory=list)  # every URL requested, in order
    popups: list[str] = field(default_factory=list)  # windows/targets the page opened
    text: str = ""  # document.body.innerText
    charts: list[dict[str, Any]] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)
    scripts: list[dict[str, str]] = field(default_factory=list)
    event_handler_attrs: list[str] = field(default_factory=list)  # "IMG@onerror"
    data: Any = None  # the parsed <script type="application/json" id="gpudiag-data">
    data_error: str | None = None  # why it did not parse
    clipped_boxes: list[dict[str, Any]] = field(default_factory=list)  # content wider than its box
    scroll_width: int = 0  # of the page; wider than client_width = the page scrolls sideways
    client_width: int = 0
    page_width: int = 0
    page_height: int = 0
    screenshot: bytes = b""  # full-page PNG at device scale 1 (1 px = 1 CSS px)

    @property
    def console_errors(self) -> list[str]:
        return [text for level, text in self.console if level in ("error", "assert")]

    @property
    def foreign_requests(self) -> list[str]:
        """Requests for anything but the page itself."""
        return [u for u in self.requests if u != self.url]

    def save_screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.screenshot)
        return path


def find_chromium() -> str:
    """The Chromium binary, or BrowserError saying how to install it."""
    exe = shutil.which(CHROMIUM) if os.sep not in CHROMIUM else CHROMIUM
    if not exe or not os.access(exe, os.X_OK):
        raise BrowserError(f"Chromium not found at {CHROMIUM}: {INSTALL_HINT}")
    return exe


class Chromium:
    """One headless Chromium with a fresh profile; ``open()`` a page in a new tab each time."""

    def __init__(self, proc: subprocess.Popen, ws: Any, workdir: Path, width: int, height: int):
        self._proc = proc
        self._ws = ws
        self._workdir = workdir
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self.width = width
        self.height = height

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def launch(cls, workdir: Path, width: int = 1280, height: int = 900,
               timeout: float = 30.0) -> Chromium:
        import websocket  # websocket-client, from the test extra

        exe = find_chromium()
        workdir.mkdir(parents=True, exist_ok=True)
        profile = workdir / "profile"
        shutil.rmtree(profile, ignore_errors=True)
        profile.mkdir()
        log = open(workdir / "chromium.log", "wb")  # a file, not a pipe: a full pipe blocks Chromium
        args = [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                "about:blank"]
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        # Chromium writes the port it chose and the browser's websocket path here once it listens
        port_file = profile / "DevToolsActivePort"
        end = time.monotonic() + timeout
        while True:
            lines = port_file.read_text().split() if port_file.exists() else []
            if len(lines) >= 2:
                break
            if proc.poll() is not None or time.monotonic() > end:
                _stop(proc)
                tail = (workdir / "chromium.log").read_text(errors="replace")[-2000:]
                raise BrowserError(f"Chromium ({exe}) did not start (exit {proc.returncode}):\n{tail}")
            time.sleep(0.05)
        url = f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        ws = websocket.create_connection(url, timeout=timeout, suppress_origin=True)
        return cls(proc, ws, workdir, width, height)

    def close(self) -> None:
        try:
            self._call("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        try:
            self._ws.close()
        finally:
            _stop(self._proc)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- protocol ----------------------------------------------------------------------------
    def _send(self, method: str, params: dict[str, Any] | None = None,
              session: str | None = None) -> int:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self._ws.send(json.dumps(msg))
        return self._next_id

    def _recv(self, timeout: float) -> dict[str, Any] | None:
        import websocket

        self._ws.settimeout(max(timeout, 0.001))
        try:
            return json.loads(self._ws.recv())
        except websocket.WebSocketTimeoutException:
            return None

    def _call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
              timeout: float = 30.0) -> dict[str, Any]:
        """Send a command and wait for its answer; events that arrive meanwhile are kept."""
        want = self._send(method, params, session)
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no answer to {method} in {timeout:.0f}s")
            msg = self._recv(left)
            if msg is None:
                continue
            if msg.get("id") == want:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        self._events.append(msg)
        if msg["method"] == "Page.javascriptDialogOpening":
            # answer at once (without waiting): an open dialog blocks the page's script
            self._send("Page.handleJavaScriptDialog", {"accept": False}, msg.get("sessionId"))

    def _pump(self, seconds: float, until: str | None = None, session: str | None = None,
              since: int = 0) -> bool:
        """Handle events for ``seconds``, or until the event ``until`` arrives for ``session``
        (or has arrived since event number ``since``, while a command waited for its answer)."""
        if until and any(m["method"] == until and m.get("sessionId") == session
                         for m in self._events[since:]):
            return True
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            msg = self._recv(left)
            if msg is None or "method" not in msg:
                continue
            self._event(msg)
            if until and msg["method"] == until and msg.get("sessionId") == session:
                return True
        return until is None

    # -- pages -------------------------------------------------------------------------------
    def open(self, path: Path, settle: float = 0.5, timeout: float = 60.0) -> Page:
        """Load ``path`` from file:// in a new tab; return what it did once loaded and settled."""
        url = path.resolve().as_uri()
        page = Page(url=url)
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._events = []
        try:
            for domain in ("Page", "Runtime", "Log", "Network"):
                self._call(f"{domain}.enable", session=session)
            self._call("Target.setDiscoverTargets", {"discover": True})
            self._call("Emulation.setDeviceMetricsOverride",
                       {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                        "mobile": False}, session=session)
            mark = len(self._events)
            nav = self._call("Page.navigate", {"url": url}, session=session)
            if nav.get("errorText"):
                raise BrowserError(f"{url}: {nav['errorText']}")
            end = time.monotonic() + timeout
            if not self._pump(timeout, until="Page.loadEventFired", session=session, since=mark):
                raise BrowserError(f"{url} did not finish loading in {timeout:.0f}s")
            # the load event seen may be about:blank's: wait until this document is complete
            ready = "document.readyState === 'complete' && location.href !== 'about:blank'"
            while not self._call("Runtime.evaluate", {"expression": ready, "returnByValue": True},
                                 session=session)["result"].get("value"):
                if time.monotonic() > end:
                    raise BrowserError(f"{url} did not finish loading in {timeout:.0f}s")
                self._pump(0.05)
            # late work: timers, fonts, lazy images; events keep arriving while we wait
            self._call("Runtime.evaluate", {"expression": "document.fonts.ready.then(() => 1)",
                                            "awaitPromise": True}, session=session)
            self._pump(settle)
            state = self._call("Runtime.evaluate", {"expression": _PAGE_SCRIPT, "returnByValue": True},
                               session=session)
            if "exceptionDetails" in state:
                raise BrowserError(f"measuring the page failed: {state['exceptionDetails']}")
            for k, v in state["result"]["value"].items():
                setattr(page, "final_url" if k == "url" else k, v)
            page.screenshot = self._screenshot(session)
            self._pump(0.05)
            self._collect(page, session, target)
        finally:
            self._call("Target.setDiscoverTargets", {"discover": False})
            opened = [m["params"]["targetInfo"]["targetId"] for m in self._events
                      if m["method"] == "Target.targetCreated"
                      and m["params"]["targetInfo"].get("openerId") == target]
            for t in [*opened, target]:
                try:
                    self._call("Target.closeTarget", {"targetId": t})
                except BrowserError:  # already gone
                    pass
        return page

    def _screenshot(self, session: str) -> bytes:
        metrics = self._call("Page.getLayoutMetrics", session=session)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        clip = {"x": 0, "y": 0, "width": max(1, int(size["width"])), "height": max(1, int(size["height"])),
                "scale": 1}
        shot = self._call("Page.captureScreenshot", {"format": "png", "clip": clip,
                                                     "captureBeyondViewport": True}, session=session)
        return base64.b64decode(shot["data"])

    def _collect(self, page: Page, session: str, target: str) -> None:
        for msg in self._events:
            method, p = msg["method"], msg.get("params", {})
            if method == "Target.targetCreated":
                info = p["targetInfo"]
                if info.get("openerId") == target:
                    page.popups.append(info.get("url", ""))
                continue
            if msg.get("sessionId") != session:
                continue
            if method == "Page.javascriptDialogOpening":
                page.dialogs.append(f"{p.get('type')}: {p.get('message')}")
            elif method == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                page.console.append((p.get("type", "log"), text))
            elif method == "Log.entryAdded":
                e = p["entry"]
                text = f"{e.get('text', '')} {e.get('url', '')}".strip()
                page.console.append((e.get("level", "info"), text))
            elif method == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                page.page_errors.append(d.get("exception", {}).get("description") or d.get("text", ""))
            elif method == "Network.requestWillBeSent":
                page.requests.append(p["request"]["url"])
            elif method == "Network.webSocketCreated":
                page.requests.append(p["url"])
            elif method == "Page.windowOpen":
                page.popups.append(p.get("url", ""))


def _stop(proc: subprocess.Popen) -> None:
    """End the Chromium we started (its own process group: it was started in a new session)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait()


# -- looking at a screenshot -----------------------------------------------------------------
@dataclass
class PixelStats:
    width: int
    height: int
    colours: int  # distinct RGB colours
    ink: float  # fraction of pixels that are not (near) white

    def __str__(self) -> str:
        return f"{self.width}x{self.height} px, {self.colours} colours, {self.ink:.1%} non-white"


def pixel_stats(png: bytes, box: tuple[float, float, float, float] | None = None) -> PixelStats:
    """Colours and ink of a PNG (or of ``box`` = x, y, width, height in it)."""
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    if box is not None:
        x, y, w, h = box
        img = img.crop((int(x), int(y), int(x + w), int(y + h)))
    w, h = img.size
    if w == 0 or h == 0:
        return PixelStats(w, h, 0, 0.0)
    colours = img.getcolors(maxcolors=w * h) or []
    hist = img.convert("L").histogram()
    return PixelStats(w, h, len(colours), sum(hist[:245]) / (w * h))
