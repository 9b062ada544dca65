"""The operator's dashboard at `/ui`: sessions, their timelines, network and audit.

Server-rendered (Jinja2) with htmx for progressive enhancement and server-sent events for
the live parts; every page reads without JavaScript. Only the admin token opens it, at the
login form, for a cookie (`corral.dashboard.gate`). Built by `corral.server.app` beside the
REST and MCP routes, over the same service.
"""
