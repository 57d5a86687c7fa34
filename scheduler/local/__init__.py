"""The embedded gang scheduler for one shared machine: ``gpudiag scheduler serve`` and its clients.

The policy is the shared core (``gpudiag.scheduler.policy``); this package is the runtime
around it: a SQLite store that survives a SIGKILL at any moment (``store``), a Unix-socket
protocol that knows its caller from the kernel (``protocol``), a process runner whose jobs
outlive the daemon (``runner``), the agent's signals (``signals``), and the event loop that
ties them together (``daemon``).
"""
