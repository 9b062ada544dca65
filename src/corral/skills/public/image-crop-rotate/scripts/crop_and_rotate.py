#!/usr/bin/env python3
"""Crop an image to its centre, then rotate it clockwise (Pillow)."""

from __future__ import annotations

import argparse
import sys

from PIL import Image

TURNS = {
    0: None,
    90: Image.Transpose.ROTATE_270,
    180: Image.Transpose.ROTATE_180,
    270: Image.Transpose.ROTATE_90,
}


def centre(image: Image.Image, keep: float) -> Image.Image:
    """The centre `keep` of the image's width and height."""
    width, height = max(1, round(image.width * keep)), max(1, round(image.height * keep))
    left, top = (image.width - width) // 2, (image.height - height) // 2
    return image.crop((left, top, left + width, top + height))


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError("--keep is a fraction above 0, at most 1")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument(
        "--keep", type=fraction, default=0.5, help="fraction of width and height kept (0.5)"
    )
    parser.add_argument(
        "--degrees", type=int, choices=sorted(TURNS), default=90, help="clockwise (90)"
    )
    args = parser.parse_args()
    with Image.open(args.input) as image:
        cropped = centre(image, args.keep)
        turn = TURNS[args.degrees]
        done = cropped if turn is None else cropped.transpose(turn)
        if args.output.lower().endswith((".jpg", ".jpeg")) and done.mode not in ("RGB", "L"):
            done = done.convert("RGB")
        done.save(args.output)
        sizes = [f"{im.width}x{im.height}" for im in (image, cropped, done)]
    print(" -> ".join(sizes) + f"; wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
