"""The sandbox: policy as data, bwrap argv as a pure function, seccomp, limits and spawning.

Nothing here knows of Jupyter or HTTP.
"""
