"""The dashboard's HTML: Jinja2 templates (autoescaped) and the filters they use.

What a sandbox produced is shown, never trusted: text is escaped, images are shown only as
`data:` images of their declared type (a kernel's base64 checked first), and an HTML result
goes into an `<iframe sandbox>` (no scripts, an opaque origin) under the page's Content
Security Policy, which allows no inline script at all.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import BashLexer, PythonLexer
from starlette.background import BackgroundTask
from starlette.responses import HTMLResponse

HERE = Path(__file__).parent
CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "frame-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
_FORMATTER = HtmlFormatter(cssclass="code", wrapcode=True)
_LEXERS = {"python": PythonLexer(), "bash": BashLexer()}
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def code_css() -> str:
    """The highlighter's style sheet (served at /ui/static/code.css)."""
    return str(_FORMATTER.get_style_defs(".code"))


def _highlight(code: str, language: str | None) -> Markup:
    lexer = _LEXERS.get(language or "python", _LEXERS["python"])
    return Markup(highlight(code, lexer, _FORMATTER))  # noqa: S704 (pygments escapes)


def _size(value: int | float | None) -> str:
    if value is None:
        return "–"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _when(at: float | None) -> str:
    if at is None:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _clock(at: float | None) -> str:
    return "–" if at is None else time.strftime("%H:%M:%S", time.localtime(at))


def _iso(at: float | None) -> str:
    return "" if at is None else time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(at))


def _dom_id(value: str) -> str:
    """An element id for any name (session ids may hold dots, which selectors would read)."""
    return "x" + value.encode().hex()


def _sparkline(values: Sequence[float], ceiling: float | None = None) -> Markup:
    """A small SVG line of `values` (oldest first) scaled to `ceiling` or their maximum."""
    width, height = 120, 24
    if len(values) < 2:
        return Markup("")
    top = max(ceiling or 0.0, max(values), 1e-9)
    step = width / (len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}" for i, v in enumerate(values)
    )
    return Markup(  # noqa: S704 (numbers only)
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-hidden="true" focusable="false"><polyline fill="none" stroke="currentColor" '
        f'stroke-width="1.5" points="{points}"/></svg>'
    )


def _image(data: Mapping[str, Any]) -> str | None:
    """A `data:` URL for the bundle's image, or None when it has none that checks out."""
    for mime in IMAGE_TYPES:
        payload = data.get(mime)
        if isinstance(payload, str) and _BASE64.fullmatch(payload):
            return f"data:{mime};base64,{''.join(payload.split())}"
    svg = data.get("image/svg+xml")
    if isinstance(svg, str):
        return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    return None


def _text_of(data: Mapping[str, Any]) -> str:
    for mime in ("text/markdown", "text/plain", "application/json"):
        if mime in data:
            value = data[mime]
            return value if isinstance(value, str) else str(value)
    return ", ".join(sorted(data)) or "(empty display)"


def _detail(detail: Mapping[str, Any] | None) -> str:
    """An entry's detail as compact JSON text (escaped by the template like any text)."""
    if not detail:
        return ""
    return json.dumps(dict(detail), default=str, separators=(", ", ": "))


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        size=_size,
        when=_when,
        clock=_clock,
        iso=_iso,
        dom_id=_dom_id,
        sparkline=_sparkline,
        highlight=_highlight,
        image=_image,
        text_of=_text_of,
        detail=_detail,
    )
    return env


class Pages:
    """Renders templates into responses with the dashboard's security headers."""

    def __init__(self) -> None:
        self.env = environment()

    def html(self, name: str, **context: Any) -> str:
        return self.env.get_template(name).render(**context)

    def macro(self, template: str, name: str, *args: Any) -> str:
        """One macro of a template, rendered alone (a live fragment)."""
        return str(getattr(self.env.get_template(template).module, name)(*args))

    def response(
        self,
        name: str,
        status: int = 200,
        background: BackgroundTask | None = None,
        **context: Any,
    ) -> HTMLResponse:
        return HTMLResponse(
            self.html(name, **context), status, headers=HEADERS, background=background
        )
