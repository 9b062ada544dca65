"""The service's areas, each one concept with its dependencies given at construction:
`trail` (the audit log as written and read), `files` (workspaces), `network` (policies and
access requests), `skills`, and `controls` (the operator's limits and bridge switches).
`corral.service.Service` builds them once, in its constructor, and owns sessions and
execution itself."""
