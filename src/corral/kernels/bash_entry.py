"""The bash kernel's entry point inside a sandbox (run as a script, never imported by corral).

It is bash_kernel's own kernel with two answers made honest:

- a command that fails says so in words: the error's text is `exit status N`, where
  bash_kernel sent an empty name and the bare number (shown as `: 2`).
- `exit N` (bash itself ending) is an error with that status and says a new bash was
  started, where bash_kernel printed bash's `exit` and `Restarting Bash`, then asked the new
  bash for its status and answered `ok`.
"""

import os
import sys

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this script's folder: the agent's imports must not see it

from typing import Any

from bash_kernel.kernel import BashKernel  # type: ignore[import-untyped]
from ipykernel.kernelapp import IPKernelApp
from pexpect import EOF  # type: ignore[import-untyped]

ENAME = "exit status"


class Bash(BashKernel):  # type: ignore[misc]  # bash_kernel has no type hints
    _held = ""  # a last output line `exit`: bash's own word when it ends, or the user's

    def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: Any = None,
        allow_stdin: bool = False,
    ) -> dict[str, Any]:
        self.silent = silent
        if code.strip().endswith("\\"):  # bash would wait for the next line forever
            return self._failed("", "the code ends with a line continuation (\\)")
        if not code.strip():
            return self._ok()
        try:
            self.bashwrapper.run_command(code.rstrip(), timeout=None)
        except KeyboardInterrupt:
            self._release_held()
            self.bashwrapper.child.sendintr()
            self.bashwrapper._expect_prompt()
            self.process_output(self.bashwrapper.child.before)
            return {"status": "abort", "execution_count": self.execution_count}
        except EOF:
            return self._bash_ended()
        self._release_held()
        status = self._last_status()
        return self._ok() if status == 0 else self._failed(str(status), f"exit status {status}")

    def process_output(self, output: str) -> None:
        """Stream `output`, holding back a last line `exit` until bash is known to live on."""
        lines = (self._held + output).splitlines(keepends=True)
        self._held = lines.pop() if lines and lines[-1].strip() == "exit" else ""
        if lines:
            super().process_output("".join(lines))

    def _release_held(self) -> None:
        held, self._held = self._held, ""
        if held:
            super().process_output(held)

    def _last_status(self) -> int:
        answer = self.bashwrapper.run_command("{ echo $?; } 2>/dev/null")
        try:
            return int(answer.strip().splitlines()[0])
        except (ValueError, IndexError):
            return 1

    def _bash_ended(self) -> dict[str, Any]:
        """The shell exited: send what it printed last (not its own `exit`), start another."""
        child = self.bashwrapper.child
        self.process_output(child.before)
        self._held = ""  # bash's `exit`
        child.close()
        status = (
            child.exitstatus if child.exitstatus is not None else 128 + (child.signalstatus or 0)
        )
        self._start_bash()
        return self._failed(
            str(status), f"bash exited with status {status}; a new bash was started"
        )

    def _ok(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "execution_count": self.execution_count,
            "payload": [],
            "user_expressions": {},
        }

    def _failed(self, status: str, text: str) -> dict[str, Any]:
        error = {"ename": ENAME, "evalue": status, "traceback": [text]}
        self.send_response(self.iopub_socket, "error", error)
        return {**error, "status": "error", "execution_count": self.execution_count}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=Bash)
