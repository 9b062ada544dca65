"""The in-sandbox half of a browser fetch: drive Chromium with Playwright, print JSON.

Run inside a sandbox as `python runner.py REQUEST_JSON`. Chromium's only way out is the
forwarder at 127.0.0.1:3128 (the host proxy applies the browsing policy to every
connection, redirects, frames, subresources, workers and WebSockets included). The result is
one JSON object on stdout; the browser is always closed. Imports nothing of corral.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Any

PROXY = "http://127.0.0.1:3128"
CHROMIUM_ARGS = (
    # The bwrap sandbox (no network but the proxy, seccomp, no capabilities) replaces
    # Chromium's own, which would need the user namespaces the sandbox forbids.
    "--no-sandbox",
    f"--proxy-server={PROXY}",
    # Chromium sends localhost around a proxy unless told not to: everything goes through it.
    "--proxy-bypass-list=<-loopback>",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-breakpad",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--no-pings",
    "--no-default-browser-check",
    "--disable-features=DnsOverHttps,Translate,OptimizationHints,MediaRouter,"
    "AutofillServerCommunication,CertificateTransparencyComponentUpdater,"
    "InterestFeedContentSuggestions,PrivacySandboxSettings4",
)
TEXT_JS = """(limit) => {
  const body = document.body;
  const text = body ? body.innerText : (document.documentElement.innerText || "");
  return [text.length, text.slice(0, limit)];
}"""
LINKS_JS = """(limit) => Array.from(document.links).slice(0, limit).map(
  (a) => ({href: a.href, text: (a.innerText || "").trim().slice(0, 200)}))"""


def fetch(request: dict[str, Any]) -> dict[str, Any]:
    """Load the page and collect title, final URL, visible text, links, and a screenshot."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    timeout_ms = int(request["timeout_s"] * 1000)
    started = time.monotonic()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=request["chromium"],
            args=list(CHROMIUM_ARGS),
            timeout=int(request["launch_timeout_s"] * 1000),
        )
        try:
            page = browser.new_context(accept_downloads=False).new_page()
            page.set_default_timeout(timeout_ms)
            result: dict[str, Any] = {"loaded": True, "status": None}
            try:
                response = page.goto(request["url"], wait_until="load", timeout=timeout_ms)
                result["status"] = response.status if response is not None else None
            except PlaywrightTimeout:
                result["loaded"] = False
            except PlaywrightError as exc:
                return {"error": _first_line(str(exc)), "kind": "navigation"}
            result.update(_collect(page, request, max(1000, timeout_ms // 4)))
            result["elapsed_s"] = round(time.monotonic() - started, 3)
            return result
        finally:
            browser.close()


def _collect(page: Any, request: dict[str, Any], timeout_ms: int) -> dict[str, Any]:
    page.set_default_timeout(timeout_ms)
    length, text = page.evaluate(TEXT_JS, request["max_chars"])
    collected: dict[str, Any] = {
        "url": page.url,
        "title": page.title(),
        "text": text,
        "text_chars": length,
        "links": page.evaluate(LINKS_JS, request["max_links"]),
    }
    if request.get("screenshot"):
        png = page.screenshot(type="png", timeout=timeout_ms)
        collected["screenshot_png"] = base64.b64encode(png).decode("ascii")
    return collected


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "navigation failed"


def main(argv: list[str]) -> None:
    try:
        result = fetch(json.loads(argv[1]))
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {_first_line(str(exc))}", "kind": "browser"}
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv)
