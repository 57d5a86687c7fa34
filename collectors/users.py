"""A uid's login name, as this node's account database (passwd, LDAP through NSS) has it.

The agent labels a job's series with the uid that wrote its signals, which the kernel vouches
for; a name is what a person reads on a fleet page. The name is looked up here, on the node,
because that is where the uid means something (a fleet page reading Prometheus from another
host may not know the cluster's users). A lookup through NSS can reach a directory server, so
each answer is kept for a while, a missing name too; the cache is bounded so that a flood of
uids cannot grow it.
"""

from __future__ import annotations

import pwd
import time
from collections.abc import Callable

KEEP_S = 600.0        # a name is looked up again after this long (a user added to LDAP appears)
MAX_ENTRIES = 4096    # more uids than this at once: the cache starts over


class UserNames:
    """``names(uid)`` -> the login name, or None where the node has no account for the uid."""

    def __init__(self, lookup: Callable[[int], str] | None = None,
                 clock: Callable[[], float] = time.monotonic, keep_s: float = KEEP_S,
                 max_entries: int = MAX_ENTRIES) -> None:
        self._lookup = lookup or (lambda uid: pwd.getpwuid(uid).pw_name)
        self._clock = clock
        self._keep_s = keep_s
        self._max = max_entries
        self._cache: dict[int, tuple[str | None, float]] = {}

    def __call__(self, uid: int) -> str | None:
        now = self._clock()
        hit = self._cache.get(uid)
        if hit is not None and hit[1] > now:
            return hit[0]
        try:
            name: str | None = self._lookup(uid)
        except (KeyError, OverflowError, ValueError):
            name = None
        if len(self._cache) >= self._max:
            self._cache.clear()
        self._cache[uid] = (name, now + self._keep_s)
        return name
