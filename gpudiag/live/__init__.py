"""The live view (`gpudiag top`): reading agents, Prometheus and the scheduler; the snapshot."""
