"""Which teams a user belongs to: an administrator's fact, never what the user types.

Teams come from the user's Unix groups (``getgrouplist``) or a root-owned teams file, plus a team
of the user's own name; the daemon's own user may name any team. A team a user could simply name
would let them spend another team's quota (issue 30). docs/local-scheduler.md, "Teams".
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from gpudiag.errors import BadInput
from gpudiag.scheduler.local import fields

GROUPS = "groups"
MAX_TEAMS_FILE_BYTES = 4 << 20   # a thousand users with a dozen teams each is ~100 KiB


class NotInTeam(ValueError):
    """A ``--team`` its user does not belong to; the message is the one line the client shows."""


@dataclass(frozen=True)
class Membership:
    default: str
    teams: tuple[str, ...]    # the default first


def parse_teams_file(text: str, where: str) -> dict[str, tuple[str, ...]]:
    """``user: team [team ...]`` lines (``#`` comments) -> user -> teams, the default first."""
    out: dict[str, tuple[str, ...]] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        user, sep, rest = line.partition(":")
        user, teams = user.strip(), rest.split()
        if not sep or not user or not teams:
            raise BadInput(f"{where} line {n}: write `user: team [team ...]` (the first team is the "
                           f"user's default), not {raw.strip()[:60]!r}")
        bad = next((t for t in teams if fields.label_error("team", t)), None)
        if bad is not None:
            raise BadInput(f"{where} line {n}: team {bad[:60]!r}: {fields.label_error('team', bad)}")
        if user in out:
            raise BadInput(f"{where} line {n}: {user} is listed twice (give each user one line)")
        out[user] = tuple(dict.fromkeys(teams))
    return out


def _file_problem(path: Path, owners: set[int]) -> tuple[str | None, os.stat_result | None]:
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot read the teams file {path}: {e.strerror}", None
    if not stat.S_ISREG(st.st_mode):
        return f"the teams file {path} is not a regular file (a link or folder is refused)", None
    if st.st_uid not in owners:
        return (f"the teams file {path} is owned by uid {st.st_uid}: it must be root's (chown root "
                f"{path}), since it decides whose quota each user may use"), None
    if st.st_nlink > 1:   # a hard link to it elsewhere: whoever owns that folder chose its content
        return f"the teams file {path} has {st.st_nlink} hard links: give it one (cp, not ln)", None
    if st.st_mode & 0o022:
        return (f"the teams file {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
                f"chmod go-w {path}"), None
    if st.st_size > MAX_TEAMS_FILE_BYTES:
        return f"the teams file {path} is larger than {MAX_TEAMS_FILE_BYTES >> 20} MiB", None
    return None, st


class Teams:
    """``--teams groups`` or ``--teams FILE``: who may name which team."""

    def __init__(self, source: str = GROUPS) -> None:
        self.source = source
        self.path = None if source == GROUPS else Path(source)
        self._admin = os.geteuid()
        self._owners = {0, self._admin}
        self._table: dict[str, tuple[str, ...]] = {}
        self._seen: tuple[int, int, int] | None = None
        self.notes: list[str] = []   # what the daemon logs: a changed file it could not use
        self._noted: str | None = None
        if self.path is not None:
            why = self._load()
            if why:
                raise BadInput(why)

    def describe(self) -> str:
        return "Unix groups" if self.path is None else f"teams file {self.path}"

    def _load(self) -> str | None:
        """(Re)read the file if it changed; why it cannot be used, or None."""
        assert self.path is not None
        why, st = _file_problem(self.path, self._owners)
        if why:
            return why
        assert st is not None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._seen:
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                if os.fstat(f.fileno()).st_ino != st.st_ino:
                    return f"the teams file {self.path} was replaced while it was read"
                text = f.read(MAX_TEAMS_FILE_BYTES + 1).decode("utf-8", "replace")
            self._table = parse_teams_file(text, str(self.path))
        except OSError as e:
            return f"cannot read the teams file {self.path}: {e.strerror}"
        except BadInput as e:
            return str(e)
        self._seen = key
        return None

    def membership(self, uid: int, user: str) -> Membership:
        if self.path is not None:
            why = self._load()
            if why and why != self._noted:   # once per problem, not at every submit
                self.notes.append(f"{why}; keeping the teams read before")
            self._noted = why
            listed = self._table.get(user, ())
            return Membership(listed[0] if listed else user, tuple(dict.fromkeys((*listed, user))))
        try:
            gids = os.getgrouplist(user, pwd.getpwuid(uid).pw_gid)
        except (KeyError, OSError):
            gids = []
        names = []
        for g in gids:
            try:
                names.append(grp.getgrgid(g).gr_name)
            except KeyError:
                continue
        return Membership(user, tuple(dict.fromkeys((user, *sorted(names)))))

    def team_for(self, uid: int, user: str, asked: str) -> str:
        """The team a job of ``user`` runs as: ``asked`` if theirs, their default if empty.
        ``NotInTeam`` names their teams."""
        if uid == self._admin:
            return asked or user
        m = self.membership(uid, user)
        if not asked:
            return m.default
        if asked in m.teams:
            return asked
        mine = ", ".join(f"{t} (default)" if t == m.default else t for t in m.teams)
        raise NotInTeam(f"--team {asked}: {user} is not in team {asked} (teams come from the "
                        f"{self.describe()}); your teams: {mine}")
