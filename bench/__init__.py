"""Benchmarks of corral against an unsandboxed jupyter_client kernel, run by `make bench`.

Each figure (cold session start, `1+1` round trip, idle memory per session) is measured beside
a baseline taken in the same run: a plain `AsyncKernelManager` kernel over the same ipc
transport, without bwrap. Results go to stdout (Markdown) and to `bench/results/`.
"""
