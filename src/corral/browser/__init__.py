"""Browser fetch: Chromium driven by Playwright inside a sandbox, through the egress proxy."""
