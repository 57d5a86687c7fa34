"""The embedded gang scheduler for one shared machine: ``gpudiag scheduler serve`` and its clients.

The runtime around the shared policy core; docs/layout.md lists the modules.
"""
