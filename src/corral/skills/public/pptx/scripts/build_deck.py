#!/usr/bin/env python3
"""Build a PowerPoint deck (.pptx) from a JSON outline.

{"title": "Deck title", "subtitle": "optional",
 "slides": [{"title": "A slide", "bullets": ["point", ["sub-point", "sub-point"]],
             "image": "chart.png", "notes": "speaker notes"}]}

A nested list of bullets is one level deeper. A slide with an image and bullets puts the
bullets on the left and the image on the right; an image alone fills the slide body.
Relative image paths are read from the outline's folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pptx import Presentation
from pptx.util import Emu, Inches

TITLE_LAYOUT, BULLETS_LAYOUT, TITLE_ONLY_LAYOUT = 0, 1, 5


def add_bullets(body: Any, bullets: list[Any], level: int = 0) -> None:
    for item in bullets:
        if isinstance(item, list):
            add_bullets(body, item, level + 1)
            continue
        paragraph = body.paragraphs[0] if not body.text and level == 0 else body.add_paragraph()
        paragraph.text = str(item)
        paragraph.level = level


def add_image(slide: Any, path: Path, left: int, top: int, width: int, height: int) -> None:
    picture = slide.shapes.add_picture(str(path), left, top)
    scale = min(width / picture.width, height / picture.height, 1.0)
    picture.width, picture.height = int(picture.width * scale), int(picture.height * scale)
    picture.left = left + (width - picture.width) // 2
    picture.top = top + (height - picture.height) // 2


def add_slide(deck: Any, spec: dict[str, Any], base: Path) -> None:
    bullets, image = spec.get("bullets") or [], spec.get("image")
    layout = BULLETS_LAYOUT if bullets else TITLE_ONLY_LAYOUT
    slide = deck.slides.add_slide(deck.slide_layouts[layout])
    slide.shapes.title.text = str(spec.get("title", ""))
    margin, top = Inches(0.5), Inches(1.6)
    width, height = deck.slide_width - 2 * margin, deck.slide_height - top - margin
    if bullets:
        body = slide.placeholders[1]
        if image:
            body.left, body.top, body.width, body.height = margin, top, width // 2, height
        add_bullets(body.text_frame, bullets)
    if image:
        left = margin + width // 2 if bullets else margin
        add_image(slide, base / image, Emu(left), top, width // 2 if bullets else width, height)
    if spec.get("notes"):
        slide.notes_slide.notes_text_frame.text = str(spec["notes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("outline", help="the JSON outline")
    parser.add_argument("output", help="the .pptx file to write")
    args = parser.parse_args()

    outline_path = Path(args.outline)
    outline = json.loads(outline_path.read_text(encoding="utf-8"))
    deck = Presentation()
    title_slide = deck.slides.add_slide(deck.slide_layouts[TITLE_LAYOUT])
    title_slide.shapes.title.text = str(outline.get("title", ""))
    title_slide.placeholders[1].text = str(outline.get("subtitle", ""))
    for spec in outline.get("slides", []):
        add_slide(deck, spec, outline_path.parent)
    deck.save(args.output)
    print(f"wrote {len(deck.slides)} slides to {args.output}")


if __name__ == "__main__":
    main()
