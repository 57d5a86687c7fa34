"""``gpudiag top``'s terminal UI (Textual): two tables over one ``Snapshot``, refreshed on a timer.

The app owns no numbers: each refresh asks ``fetch`` for a new snapshot (in a worker thread, so a
slow agent never freezes the keys) and re-renders the cells ``reports.top_view`` makes of it.
A job that reported its end is marked "(ended)" with its last values for one refresh, then
dropped (its agent keeps exporting it a while, for Prometheus). Keys: ``s`` next sort column,
``r`` reverse it, ``o`` filter by owner (empty: everyone), Enter on a job shows its latest
report's path, ``q`` quits.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Input, Static

from gpudiag.live.snapshot import SORT_KEYS, JobRow, Snapshot, drop_shown_ended, filter_owner, sort_jobs
from gpudiag.reports.top_view import DEVICE_COLUMNS, JOB_COLUMNS, device_cells, headline, job_cells, problems

SORT_ORDER = tuple(SORT_KEYS)


def report_line(job: JobRow) -> str:
    """What Enter shows: where the job's report is, or why there is none to open yet."""
    if job.report_path is None:
        return f"{job.job_id}: no run directory known (the job's agent did not report one)"
    if os.path.exists(job.report_path):
        return f"{job.job_id}: report {job.report_path}"
    if job.run_dir and os.path.isdir(job.run_dir):
        return (f"{job.job_id}: no report yet in {job.run_dir} (written when the job ends; "
                f"`gpudiag report {job.run_dir}` makes one now)")
    return f"{job.job_id}: report {job.report_path} (on {job.nodes or 'its node'})"


class TopApp(App[None]):
    CSS = """
    #head { height: auto; }
    #devices { height: auto; max-height: 45%; }
    #jobs { height: 1fr; }
    #detail { height: auto; }
    #owner { dock: bottom; display: none; }
    """
    BINDINGS = [
        Binding("s", "next_sort", "sort"),
        Binding("r", "reverse", "reverse"),
        Binding("o", "owner", "filter owner"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, fetch: Callable[[], Snapshot], interval: float) -> None:
        super().__init__()
        self.fetch = fetch
        self.interval = interval
        self.snap: Snapshot | None = None
        self.sort = "waste"
        self.reverse = False
        self.owner = ""
        self.shown: list[JobRow] = []
        self.ended_shown: set[tuple[str, str | None]] = set()  # ended jobs a refresh has shown

    def compose(self) -> ComposeResult:
        yield Static("gpudiag top · reading…", id="head")
        yield DataTable(id="devices", cursor_type="none", zebra_stripes=True)
        yield DataTable(id="jobs", cursor_type="row", zebra_stripes=True)
        yield Static("", id="detail")
        yield Input(placeholder="owner (empty: everyone), Enter", id="owner")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#devices", DataTable).add_columns(*DEVICE_COLUMNS)
        self.query_one("#jobs", DataTable).add_columns(*JOB_COLUMNS)
        self.query_one("#jobs", DataTable).focus()
        self._refresh()
        self.set_interval(self.interval, self._refresh)

    def _refresh(self) -> None:
        self.run_worker(self._fetch, thread=True, exclusive=True, group="fetch")

    def _fetch(self) -> None:
        try:
            snap = self.fetch()
        except Exception as e:  # noqa: BLE001 - one bad read is a line on screen, not a traceback
            self.call_from_thread(self.query_one("#head", Static).update,
                                  f"gpudiag top · could not build the view: {type(e).__name__}: {e}")
            return
        self.call_from_thread(self._show, snap)

    def _show(self, snap: Snapshot | None = None) -> None:
        if snap is not None:  # a new read: ended jobs shown by the last one are dropped
            self.ended_shown = drop_shown_ended(snap, self.ended_shown)
            self.snap = snap
        if self.snap is None:
            return
        snap = self.snap
        head = [headline(snap, self.sort, self.reverse, self.owner), *problems(snap)]
        self.query_one("#head", Static).update("\n".join(head))
        devices = self.query_one("#devices", DataTable)
        devices.clear()
        for d in snap.devices:
            devices.add_row(*device_cells(d))
        jobs = self.query_one("#jobs", DataTable)
        row = jobs.cursor_row
        jobs.clear()
        self.shown = filter_owner(sort_jobs(snap.jobs, self.sort, self.reverse), self.owner)
        for j in self.shown:
            jobs.add_row(*job_cells(j))
        if not self.shown:
            self.query_one("#detail", Static).update(
                f"no jobs of owner {self.owner}" if self.owner else "no jobs reporting")
        elif row < len(self.shown):
            jobs.move_cursor(row=row)

    def action_next_sort(self) -> None:
        self.sort = SORT_ORDER[(SORT_ORDER.index(self.sort) + 1) % len(SORT_ORDER)]
        self._show()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self._show()

    def action_owner(self) -> None:
        box = self.query_one("#owner", Input)
        box.display = True
        box.value = ""
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.owner = event.value.strip()
        event.input.display = False
        self.query_one("#detail", Static).update("")
        self.query_one("#jobs", DataTable).focus()
        self._show()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "jobs" and 0 <= event.cursor_row < len(self.shown):
            self.query_one("#detail", Static).update(report_line(self.shown[event.cursor_row]))
