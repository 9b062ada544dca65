"""matplotlib's font list: built once in a sandbox, copied into new sessions, never trusted back."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from corral.config import Settings
from corral.sandbox.fontcache import cache_key, is_font_list, kept_list, read_built_list
from corral.sandbox.runtime import current_runtime
from corral.service import Service

PLOT = (
    "import matplotlib\n"
    "matplotlib.use('Agg')\n"
    "import matplotlib.pyplot as plt\n"
    "plt.plot([1])\n"
    "plt.savefig('/workspace/plot.png')\n"
)


async def test_a_new_session_finds_the_font_list_and_plots_silently(settings: Settings) -> None:
    async with Service(settings) as service:
        font_list = await service.host.fonts.wait_ready()
        assert font_list is not None and font_list.name.startswith("fontlist-v")
        kept_mtime = font_list.stat().st_mtime_ns
        info = await service.create_session("plot")
        copy = settings.sessions_dir / "plot" / "env" / "mpl" / font_list.name
        assert copy.read_bytes() == font_list.read_bytes()  # there before the first import
        before = copy.stat().st_mtime_ns
        result = await service.executions.run(PLOT, session_id="plot")
        assert result.status == "ok", result.text()
        assert result.stderr == ""
        assert (info.workspace / "plot.png").stat().st_size > 0
        assert copy.stat().st_mtime_ns == before  # matplotlib did not rebuild it
    async with Service(settings) as again:  # a later server has it from its start on
        assert again.host.fonts.ready == font_list
        assert font_list.stat().st_mtime_ns == kept_mtime


async def test_a_session_survives_a_corrupt_font_list(service: Service) -> None:
    font_list = await service.host.fonts.wait_ready()
    assert font_list is not None
    info = await service.create_session("broken")
    inside = f"/opt/corral/env/mpl/{font_list.name}"
    result = await service.executions.run(
        f"open({inside!r}, 'w').write('{{not json')\n" + PLOT, session_id="broken"
    )
    assert result.status == "ok", result.text()
    assert (info.workspace / "plot.png").stat().st_size > 0
    rebuilt = info.workspace.parent / "env" / "mpl" / font_list.name
    assert is_font_list(rebuilt.read_bytes())  # matplotlib wrote a good one again
    assert is_font_list(font_list.read_bytes())  # the server's own copy is untouched


def test_the_key_follows_the_font_set_and_needs_matplotlib(tmp_path: Path) -> None:
    runtime = current_runtime()
    fonts = tmp_path / "fonts"
    fonts.mkdir()
    empty = cache_key(runtime, (fonts,))
    assert empty is not None and empty == cache_key(runtime, (fonts,))
    (fonts / "new.ttf").write_bytes(b"x")
    assert cache_key(runtime, (fonts,)) != empty
    without = replace(runtime, site_packages=tmp_path / "no-site")
    assert cache_key(without, (fonts,)) is None


def test_a_link_or_a_bad_list_is_never_kept(tmp_path: Path) -> None:
    mpl = tmp_path / "work" / "env" / "mpl"
    mpl.mkdir(parents=True)
    secret = tmp_path / "secret.json"
    secret.write_text('{"_version": "1", "ttflist": []}')
    os.symlink(secret, mpl / "fontlist-v1.json")
    assert read_built_list(tmp_path / "work") is None
    (mpl / "fontlist-v1.json").unlink()
    (mpl / "fontlist-v1.json").write_text("[1, 2]")
    assert read_built_list(tmp_path / "work") is None
    (mpl / "fontlist-v1.json").write_text('{"_version": "1", "ttflist": []}')
    assert read_built_list(tmp_path / "work") == ("fontlist-v1.json", secret.read_bytes())
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "fontlist-v1.json").write_text("{")
    assert kept_list(kept) is None
