"""The escape battery: each test is one attempt to get out of a real session's sandbox.

Every attempt runs real code in a real sandboxed kernel, the way an agent's code would, and
asserts the exact way DESIGN section 3, 5 and 7 say it must fail. One service serves the
module with two sessions: A (`esc-a`, a read-write project mount) and B (`esc-b`), under small
limits (256 MiB memory, 64 tasks, a 64 MiB workspace, a 32 MiB /tmp). Beside them run a real
corral server on 127.0.0.1 (serving that same service) and a host web server on 127.0.0.2;
each counts the requests it gets. A unique secret file and a fake ~/.ssh key are planted on
the host, and every execution's output is checked for them.

The summary line at the end of the run says how many attempts were tried and how many
were blocked (a blocked attempt is a test that passed).
"""
