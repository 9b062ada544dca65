"""The HTTP server: one Starlette app with MCP at /mcp and the REST API, behind one guard."""
