"""The clean `/v1` REST API, one module per area: thin handlers that call the service and
return what it returns, each declared once with its route, its OpenAPI entry and the model
that writes its answer (`corral.server.operation`); only the streams are written here
(`executions`). `AREAS` holds them in the order their routes are matched.

Errors are not handled here: the app maps `corral.errors` and validation failures to
statuses in one place (`corral.server.errors`).
"""

from corral.server.rest import (
    browser,
    executions,
    files,
    network,
    operator,
    secrets,
    sessions,
    skills,
)

AREAS = (sessions, executions, files, operator, skills, browser, network, secrets)
