"""The kernel runtime (issue 20): each family of coderunner's libraries does one real thing in
a real sandbox with no network, and the server's own packages are not there to import.

One session runs them all, one after the other, as an agent's notebook would.
"""

from __future__ import annotations

import base64
import shutil

import pytest

from corral.sandbox.runtime import RUNTIME_LIBRARIES, SERVER_ONLY
from corral.service import Service

SID = "libraries"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
async def service(shared_service: Service) -> Service:
    await shared_service.create_session(SID)
    return shared_service


async def run(service: Service, code: str, language: str = "python") -> str:
    """The code's stdout; fails the test with everything the kernel said otherwise."""
    result = await service.executions.run(code, session_id=SID, language=language)
    assert result.status == "ok", result.text()
    return result.stdout


async def test_every_listed_library_imports_without_network(service: Service) -> None:
    code = (
        "import importlib, socket\n"
        "print([name for _, name in socket.if_nameindex()])\n"
        f"for name in {RUNTIME_LIBRARIES!r}:\n"
        "    importlib.import_module(name)\n"
        "print('imported')\n"
    )
    assert await run(service, code) == "['lo']\nimported\n"


async def test_the_servers_own_packages_are_not_importable(service: Service) -> None:
    code = (
        "import importlib.util\n"
        f"print([n for n in {SERVER_ONLY!r} if importlib.util.find_spec(n) is not None])\n"
    )
    assert await run(service, code) == "[]\n"


async def test_scikit_learn_fits_a_model(service: Service) -> None:
    code = (
        "from sklearn.datasets import load_iris\n"
        "from sklearn.linear_model import LogisticRegression\n"
        "from sklearn.model_selection import train_test_split\n"
        "X, y = load_iris(return_X_y=True)\n"
        "Xa, Xb, ya, yb = train_test_split(X, y, random_state=0, stratify=y)\n"
        "model = LogisticRegression(max_iter=500).fit(Xa, ya)\n"
        "print(model.score(Xb, yb) > 0.9)\n"
    )
    assert await run(service, code) == "True\n"


async def test_scipy_and_statsmodels_compute_statistics(service: Service) -> None:
    code = (
        "import numpy as np, scipy.stats, statsmodels.api as sm\n"
        "t = scipy.stats.ttest_ind([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])\n"
        "print(round(float(t.statistic), 3), round(float(t.pvalue), 5))\n"
        "x = np.arange(20.0)\n"
        "fit = sm.OLS(3 * x + 2, sm.add_constant(x)).fit()\n"
        "print([round(float(p), 6) for p in fit.params])\n"
        "import sympy\n"
        "print(sympy.solve(sympy.Symbol('z') ** 2 - 4))\n"
    )
    assert await run(service, code) == "-5.0 0.00105\n[2.0, 3.0]\n[-2, 2]\n"


async def test_a_seaborn_plot_comes_back_as_png(service: Service) -> None:
    code = (
        "import seaborn as sns, pandas as pd, matplotlib.pyplot as plt\n"
        "frame = pd.DataFrame({'x': range(50), 'y': [i % 7 for i in range(50)]})\n"
        "sns.scatterplot(data=frame, x='x', y='y')\n"
        "plt.show()\n"
    )
    result = await service.executions.run(code, session_id=SID)
    assert result.status == "ok", result.text()
    pngs = [bundle["image/png"] for bundle in result.results if "image/png" in bundle]
    assert len(pngs) == 1
    assert base64.b64decode(pngs[0]).startswith(PNG_MAGIC)


async def test_duckdb_queries_a_csv_and_pyarrow_round_trips_parquet(service: Service) -> None:
    code = (
        "import duckdb, pyarrow as pa, pyarrow.parquet as pq\n"
        "rows = 'region,amount\\nnorth,10\\nsouth,5\\nnorth,7\\n'\n"
        "open('/workspace/sales.csv', 'w').write(rows)\n"
        "rows = duckdb.sql(\"select region, sum(amount) from '/workspace/sales.csv' "
        'group by region order by region").fetchall()\n'
        "print(rows)\n"
        "pq.write_table(pa.table({'n': [1, 2, 3], 's': ['a', 'b', 'c']}), '/workspace/t.parquet')\n"
        "print(pq.read_table('/workspace/t.parquet').to_pydict())\n"
        "print(duckdb.sql(\"select sum(n) from '/workspace/t.parquet'\").fetchone()[0])\n"
    )
    assert await run(service, code) == (
        "[('north', 17), ('south', 5)]\n{'n': [1, 2, 3], 's': ['a', 'b', 'c']}\n6\n"
    )


async def test_beautifulsoup_parses_a_page(service: Service) -> None:
    code = (
        "from bs4 import BeautifulSoup\n"
        'page = \'<html><body><h1>Title</h1><a href="/a">A</a><a href="/b">B</a></body></html>\'\n'
        "soup = BeautifulSoup(page, 'html.parser')\n"
        "print(soup.h1.text, [a['href'] for a in soup.find_all('a')])\n"
    )
    assert await run(service, code) == "Title ['/a', '/b']\n"


async def test_pdfplumber_and_pypdfium2_read_a_pdf_made_here(service: Service) -> None:
    code = (
        "from reportlab.pdfgen import canvas\n"
        "page = canvas.Canvas('/workspace/made.pdf')\n"
        "page.drawString(72, 720, 'Quarterly total: 1234')\n"
        "page.save()\n"
        "import pdfplumber, pypdfium2\n"
        "with pdfplumber.open('/workspace/made.pdf') as pdf:\n"
        "    print(pdf.pages[0].extract_text())\n"
        "image = pypdfium2.PdfDocument('/workspace/made.pdf')[0].render(scale=0.5).to_pil()\n"
        "print(image.size[0] > 100)\n"
        "import img2pdf\n"
        "image.save('/workspace/page.png')\n"
        "open('/workspace/back.pdf', 'wb').write(img2pdf.convert('/workspace/page.png'))\n"
        "print(open('/workspace/back.pdf', 'rb').read(5))\n"
    )
    assert await run(service, code) == "Quarterly total: 1234\nTrue\nb'%PDF-'\n"


async def test_imageio_writes_and_reads_a_video_with_its_own_ffmpeg(service: Service) -> None:
    code = (
        "import numpy as np, imageio.v2 as imageio\n"
        "frames = [np.full((32, 32, 3), i * 20, dtype=np.uint8) for i in range(10)]\n"
        "imageio.mimwrite('/workspace/clip.mp4', frames, fps=5, macro_block_size=1)\n"
        "print(len(imageio.mimread('/workspace/clip.mp4')))\n"
    )
    assert await run(service, code) == "10\n"


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="the host has no ffmpeg to show")
async def test_the_hosts_ffmpeg_converts_a_generated_clip(service: Service) -> None:
    code = (
        "cd /workspace && ffmpeg -loglevel error -y -f lavfi -i testsrc=size=64x48:rate=5 "
        "-t 1 clip.avi && ffmpeg -loglevel error -y -i clip.avi clip.gif && "
        "head -c 6 clip.gif; echo"
    )
    assert (await run(service, code, language="bash")).strip().endswith("GIF89a")


@pytest.mark.skipif(shutil.which("pdftotext") is None, reason="the host has no poppler")
async def test_poppler_reads_the_pdf_and_pdf2image_renders_it(service: Service) -> None:
    code = (
        "from reportlab.pdfgen import canvas\n"
        "page = canvas.Canvas('/workspace/poppler.pdf')\n"
        "page.drawString(72, 720, 'seen by poppler')\n"
        "page.save()\n"
        "import subprocess, pdf2image\n"
        "print(subprocess.run(['pdftotext', '/workspace/poppler.pdf', '-'], "
        "capture_output=True, text=True, check=True).stdout.strip())\n"
        "print(len(pdf2image.convert_from_path('/workspace/poppler.pdf', dpi=30)))\n"
    )
    assert await run(service, code) == "seen by poppler\n1\n"
