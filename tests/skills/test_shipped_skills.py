"""The shipped skills' scripts, run in a real sandboxed session exactly as their SKILL.md says.

Inputs are made on the host and uploaded to the workspace; outputs are read back on the host
with the same libraries, so each test checks what the script wrote, not what it printed.
One session serves the whole module.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from docx import Document
from openpyxl import load_workbook  # type: ignore[import-untyped]
from PIL import Image
from pptx import Presentation
from pypdf import PdfReader, PdfWriter
from reportlab.pdfgen import canvas

from corral.service import Service
from corral.skills import PUBLIC_DIR
from tests.conftest import make_settings

pytestmark = pytest.mark.bwrap

SESSION = "skills"
SANDBOX_PUBLIC = "/opt/corral/skills/public"


@pytest.fixture(scope="module")
async def svc(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    run = Path(tempfile.mkdtemp(prefix="crk", dir="/tmp"))
    base = tmp_path_factory.mktemp("skills")
    settings = make_settings(base / "state", run, config_dir=base / "config")
    try:
        async with Service(settings) as service:
            await service.create_session(SESSION)
            yield service
    finally:
        shutil.rmtree(run, ignore_errors=True)


async def run(svc: Service, skill: str, script: str, args: str) -> str:
    """Run a skill's script in the session's workspace; the command must be in its SKILL.md."""
    command = f"python {SANDBOX_PUBLIC}/{skill}/scripts/{script}"
    assert command in (PUBLIC_DIR / skill / "SKILL.md").read_text(), command
    result = await svc.executions.run(f"{command} {args}", session_id=SESSION, language="bash")
    assert result.status == "ok", result.text()
    return result.stdout


def upload(svc: Service, path: str, data: bytes | str) -> None:
    svc.files.write(SESSION, path, data.encode() if isinstance(data, str) else data)


def download(svc: Service, path: str) -> io.BytesIO:
    return io.BytesIO(svc.files.read(SESSION, path))


# -- every script -----------------------------------------------------------------------------


def test_every_script_is_documented_in_its_skill_md() -> None:
    for script in sorted(PUBLIC_DIR.glob("*/scripts/*.py")):
        skill = script.parent.parent.name
        command = f"python {SANDBOX_PUBLIC}/{skill}/scripts/{script.name}"
        assert command in (PUBLIC_DIR / skill / "SKILL.md").read_text(), command


async def test_every_script_starts_in_the_sandbox(svc: Service) -> None:
    code = (
        f"for f in {SANDBOX_PUBLIC}/*/scripts/*.py; do python $f --help >/dev/null || echo $f; done"
    )
    result = await svc.executions.run(code, session_id=SESSION, language="bash")
    assert (result.status, result.stdout, result.stderr) == ("ok", "", "")


# -- pdf --------------------------------------------------------------------------------------


def form_pdf() -> bytes:
    """Two pages of text; an AcroForm with two text fields on the first."""
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer)
    pdf.drawString(72, 720, "Alpha page speaks first")
    pdf.acroForm.textfield(name="name", x=72, y=600, width=200, height=20)
    pdf.acroForm.textfield(name="city", x=72, y=560, width=200, height=20)
    pdf.showPage()
    pdf.drawString(72, 720, "Bravo page comes second")
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


async def test_pdf_extract_text_reads_both_pages(svc: Service) -> None:
    upload(svc, "pdf/form.pdf", form_pdf())
    out = await run(svc, "pdf", "extract_text.py", "pdf/form.pdf")
    assert re.search(r"--- page 1 ---\nAlpha page speaks first\n.*--- page 2 ---\nBravo", out, re.S)
    await run(svc, "pdf", "extract_text.py", "pdf/form.pdf --pages 2 -o pdf/two.txt")
    assert (
        svc.files.read(SESSION, "pdf/two.txt").decode()
        == "--- page 2 ---\nBravo page comes second\n"
    )


async def test_pdf_form_fields_are_listed_and_filled(svc: Service) -> None:
    upload(svc, "pdf/form.pdf", form_pdf())
    listed = await run(svc, "pdf", "list_fields.py", "pdf/form.pdf --json")
    assert [(f["name"], f["type"]) for f in json.loads(listed)] == [
        ("name", "text"),
        ("city", "text"),
    ]

    upload(svc, "pdf/values.json", json.dumps({"city": "London"}))
    await run(
        svc,
        "pdf",
        "fill_form.py",
        "pdf/form.pdf pdf/filled.pdf name='Ada Lovelace' --json pdf/values.json",
    )
    fields = PdfReader(download(svc, "pdf/filled.pdf")).get_fields() or {}
    assert {name: field.get("/V") for name, field in fields.items()} == {
        "name": "Ada Lovelace",
        "city": "London",
    }


async def test_pdf_fill_form_refuses_an_unknown_field(svc: Service) -> None:
    upload(svc, "pdf/form.pdf", form_pdf())
    command = f"python {SANDBOX_PUBLIC}/pdf/scripts/fill_form.py pdf/form.pdf pdf/x.pdf nope=1"
    result = await svc.executions.run(command, session_id=SESSION, language="bash")
    assert result.status == "error"
    assert "no field named nope; the form has: city, name" in result.stdout + result.stderr


async def test_pdf_merge_keeps_every_page_in_order(svc: Service) -> None:
    upload(svc, "pdf/form.pdf", form_pdf())
    await run(svc, "pdf", "merge.py", "pdf/merged.pdf pdf/form.pdf pdf/form.pdf")
    pages = PdfReader(download(svc, "pdf/merged.pdf")).pages
    assert len(pages) == 4
    assert ["Alpha" in p.extract_text() for p in pages] == [True, False, True, False]


# -- docx -------------------------------------------------------------------------------------

NOTES = """# Trip report
## Findings
The weather was **fine** and the food *good*.
- first point
- second point
| Name | Qty |
|------|-----|
| Apples | 3 |
| Pears | 5 |
Closing words.
"""


async def test_docx_write_then_read_round_trips(svc: Service) -> None:
    upload(svc, "docx/notes.md", NOTES)
    await run(svc, "docx", "write_docx.py", "docx/notes.md docx/out.docx")

    document = Document(download(svc, "docx/out.docx"))
    styled = [(p.style.name if p.style else "", p.text) for p in document.paragraphs]
    assert styled == [
        ("Heading 1", "Trip report"),
        ("Heading 2", "Findings"),
        ("Normal", "The weather was fine and the food good."),
        ("List Bullet", "first point"),
        ("List Bullet", "second point"),
        ("Normal", "Closing words."),
    ]
    assert [[c.text for c in row.cells] for row in document.tables[0].rows] == [
        ["Name", "Qty"],
        ["Apples", "3"],
        ["Pears", "5"],
    ]
    bold = [run.text for run in document.paragraphs[2].runs if run.bold]
    assert bold == ["fine"]

    out = await run(svc, "docx", "read_docx.py", "docx/out.docx")
    assert out.split("\n\n")[0] == (
        "# Trip report\n## Findings\nThe weather was fine and the food good.\n"
        "- first point\n- second point"
    )
    assert "| Name | Qty |\n|---|---|\n| Apples | 3 |\n| Pears | 5 |" in out
    assert out.rstrip().endswith("Closing words.")


# -- xlsx -------------------------------------------------------------------------------------

ROWS = {
    "sheets": [
        {
            "name": "Sales",
            "rows": [
                ["Item", "Qty", "Price", "Total"],
                ["Apples", 3, 0.5, "=B2*C2"],
                ["Pears", 2, 0.75, "=B3*C3"],
                ["Sum", None, None, "=SUM(D2:D3)"],
            ],
        }
    ]
}


async def test_xlsx_formulas_are_written_as_formulas_and_read_back(svc: Service) -> None:
    upload(svc, "xlsx/rows.json", json.dumps(ROWS))
    await run(svc, "xlsx", "write_xlsx.py", "xlsx/rows.json xlsx/book.xlsx")

    sheet = load_workbook(download(svc, "xlsx/book.xlsx"))["Sales"]
    assert [c.value for c in sheet["D"]] == ["Total", "=B2*C2", "=B3*C3", "=SUM(D2:D3)"]
    assert [c.value for c in sheet[2]] == ["Apples", 3, 0.5, "=B2*C2"]
    assert sheet["A1"].font.bold and sheet.freeze_panes == "A2"

    # No spreadsheet program computes values here, so both forms show the formulas.
    for args in ("xlsx/book.xlsx --formulas", "xlsx/book.xlsx --sheet Sales"):
        out = await run(svc, "xlsx", "read_xlsx.py", args)
        assert out.splitlines()[:5] == [
            "## Sheet: Sales (A1:D4)",
            "1: Item\tQty\tPrice\tTotal",
            "2: Apples\t3\t0.5\t=B2*C2",
            "3: Pears\t2\t0.75\t=B3*C3",
            "4: Sum\t\t\t=SUM(D2:D3)",
        ]


# -- pptx -------------------------------------------------------------------------------------


def png(width: int, height: int, colour: str = "red") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, "PNG")
    return buffer.getvalue()


async def test_pptx_deck_has_the_outlines_slides(svc: Service) -> None:
    outline = {
        "title": "Quarterly review",
        "subtitle": "Q3",
        "slides": [
            {"title": "Highlights", "bullets": ["Revenue up", ["EU", "US"], "Hiring"]},
            {"title": "Trend", "image": "chart.png", "notes": "Mention August."},
        ],
    }
    upload(svc, "pptx/chart.png", png(400, 300))
    upload(svc, "pptx/outline.json", json.dumps(outline))
    await run(svc, "pptx", "build_deck.py", "pptx/outline.json pptx/deck.pptx")

    slides = list(Presentation(download(svc, "pptx/deck.pptx")).slides)
    titles = [s.shapes.title.text if s.shapes.title is not None else None for s in slides]
    assert titles == ["Quarterly review", "Highlights", "Trend"]
    body = slides[1].placeholders[1].text_frame.paragraphs
    assert [(p.text, p.level) for p in body] == [
        ("Revenue up", 0),
        ("EU", 1),
        ("US", 1),
        ("Hiring", 0),
    ]
    assert any(shape.shape_type == 13 for shape in slides[2].shapes)  # a picture
    assert slides[2].notes_slide.notes_text_frame.text == "Mention August."


# -- images -----------------------------------------------------------------------------------


async def test_images_resize_crop_rotate_convert(svc: Service) -> None:
    upload(svc, "img/photo.png", png(300, 200))
    ops = {
        "img/small.png": "resize img/photo.png img/small.png --width 150",
        "img/half.png": "resize img/photo.png img/half.png --scale 0.5",
        "img/part.png": "crop img/photo.png img/part.png --box 10 10 110 60",
        "img/turned.png": "rotate img/photo.png img/turned.png --degrees 90",
        "img/photo.jpg": "convert img/photo.png img/photo.jpg --quality 85",
    }
    for args in ops.values():
        await run(svc, "images", "image_ops.py", args)
    seen = {}
    for path in ops:
        with Image.open(download(svc, path)) as image:
            seen[path] = (image.format, image.size)
    assert seen == {
        "img/small.png": ("PNG", (150, 100)),
        "img/half.png": ("PNG", (150, 100)),
        "img/part.png": ("PNG", (100, 50)),
        "img/turned.png": ("PNG", (200, 300)),
        "img/photo.jpg": ("JPEG", (300, 200)),
    }
    info = await run(svc, "images", "image_ops.py", "info img/photo.jpg")
    assert info == "JPEG 300x200 RGB\n"


# -- coderunner's skills, by its names --------------------------------------------------------


def filled_form_pdf(values: dict[str, str]) -> bytes:
    """`form_pdf` with its fields filled (appearances kept by the viewer's redraw)."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(form_pdf())))
    writer.update_page_form_field_values(writer.pages[0], values, auto_regenerate=False)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


async def test_pdf_text_replace_changes_the_form_values_that_hold_the_text(svc: Service) -> None:
    upload(svc, "cr/f.pdf", filled_form_pdf({"name": "ADA KING", "city": "KING'S LYNN"}))
    out = await run(
        svc,
        "pdf-text-replace",
        "replace_text_in_pdf.py",
        "cr/f.pdf 'KING' 'BYRON' cr/out.pdf",
    )
    assert "2 of 2 fields changed" in out, out
    fields = PdfReader(download(svc, "cr/out.pdf")).get_fields() or {}
    assert {name: field.get("/V") for name, field in fields.items()} == {
        "name": "ADA BYRON",
        "city": "BYRON'S LYNN",
    }


async def test_pdf_text_replace_says_when_the_text_is_not_in_any_field(svc: Service) -> None:
    upload(svc, "cr/f.pdf", filled_form_pdf({"name": "ADA", "city": "LONDON"}))
    script = f"{SANDBOX_PUBLIC}/pdf-text-replace/scripts/replace_text_in_pdf.py"
    result = await svc.executions.run(
        f"python {script} cr/f.pdf PARIS ROME cr/none.pdf; echo rc=$?",
        session_id=SESSION,
        language="bash",
    )
    assert "no form field holds 'PARIS'" in result.text() and "rc=1" in result.stdout
    assert (
        "none.pdf"
        not in (await svc.executions.run("ls cr", session_id=SESSION, language="bash")).stdout
    )


async def test_image_crop_rotate_keeps_the_centre_half_and_turns_it_clockwise(
    svc: Service,
) -> None:
    image = Image.new("RGB", (200, 100), "white")
    image.paste((255, 0, 0), (50, 25, 100, 75))  # the centre's left half is red
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    upload(svc, "cr/photo.png", buffer.getvalue())
    out = await run(svc, "image-crop-rotate", "crop_and_rotate.py", "cr/photo.png cr/done.png")
    assert "200x100 -> 100x50 -> 50x100" in out, out
    with Image.open(download(svc, "cr/done.png")) as done:
        assert done.size == (50, 100)
        # Clockwise: the crop's left (red) half becomes the top half.
        assert done.getpixel((25, 20)) == (255, 0, 0)
        assert done.getpixel((25, 80)) == (255, 255, 255)
