"""Benchmarks of corral against an unsandboxed jupyter_client kernel, run by `make bench`.

Each figure is measured beside a baseline taken in the same run. Against a plain
`AsyncKernelManager` kernel running the same kernel program over the same ipc transport,
without bwrap (`bench.baseline`): cold session start and the `1+1` round trip
(`bench.measure`), executions per second with 1, 8 and 32 sessions at once
(`bench.concurrency`), and memory per session idle, busy and in a fleet of 64 idle sessions
(`bench.footprint`). Against a cold start: a session start from the warm pool
(`bench.pool`). Against in-process calls: `1+1` through a real server over REST and MCP.
Against direct connections on the host: egress through the proxy (`bench.egress`).
Results go to stdout (Markdown) and to `bench/results/` (latest.json, latest.md, and the
latency distributions in latest.png, `bench.plot`).
"""
