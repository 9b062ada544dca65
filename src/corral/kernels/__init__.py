"""Kernels inside sandboxes: the provisioner seam, sessions, execution and its result model."""
