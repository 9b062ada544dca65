"""Egress: the only way out of a sandbox. Rules are pure functions; the proxy does the I/O."""
