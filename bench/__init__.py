"""Benchmarks of corral against an unsandboxed jupyter_client kernel, run by `make bench`.

Each figure (cold session start, `1+1` round trip, idle memory per session) is measured beside
a baseline taken in the same run: a plain `AsyncKernelManager` kernel over the same ipc
transport, without bwrap. The `1+1` round trip is also taken through a real server, over REST and
over MCP, beside in-process calls from the same run. Egress (`bench.egress`) times a large
download and many new small connections through the proxy, from the host and from a sandbox,
beside the same transfers made directly on the host. Results go to stdout (Markdown) and to
`bench/results/`.
"""
