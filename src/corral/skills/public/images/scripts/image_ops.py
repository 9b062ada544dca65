#!/usr/bin/env python3
"""Resize, crop, rotate or convert an image (Pillow); `info` prints its format and size.

The output format follows the output file's extension (.png, .jpg, .webp, .gif, .bmp,
.tiff). Converting an image with transparency to JPEG puts it on a white background.
"""

from __future__ import annotations

import argparse
import sys

from PIL import Image


def save(image: Image.Image, path: str, quality: int) -> None:
    if path.lower().endswith((".jpg", ".jpeg")) and image.mode not in ("RGB", "L"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, "white")
        background.paste(rgba, mask=rgba.getchannel("A"))
        image = background
    image.save(path, quality=quality)
    print(f"wrote {path} ({image.width}x{image.height})")


def resize(image: Image.Image, args: argparse.Namespace) -> Image.Image:
    if args.scale:
        size = (round(image.width * args.scale), round(image.height * args.scale))
    elif args.width and args.height:
        size = (args.width, args.height)
    elif args.width:
        size = (args.width, round(image.height * args.width / image.width))
    elif args.height:
        size = (round(image.width * args.height / image.height), args.height)
    else:
        sys.exit("error: give --width, --height (or both) or --scale")
    return image.resize((max(1, size[0]), max(1, size[1])), Image.Resampling.LANCZOS)


def crop(image: Image.Image, args: argparse.Namespace) -> Image.Image:
    left, top, right, bottom = args.box
    if not (0 <= left < right <= image.width and 0 <= top < bottom <= image.height):
        sys.exit(f"error: box {args.box} is outside the {image.width}x{image.height} image")
    return image.crop((left, top, right, bottom))


def rotate(image: Image.Image, args: argparse.Namespace) -> Image.Image:
    # Counter-clockwise, as Pillow does; the canvas grows to hold the whole image.
    return image.rotate(args.degrees, expand=True, fillcolor=args.fill)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    info = commands.add_parser("info", help="print format, size and mode")
    info.add_argument("input")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("input")
        sub.add_argument("output")
        sub.add_argument("--quality", type=int, default=90, help="JPEG/WebP quality (1-95)")
        return sub

    sub = command("resize", "resize to a width and/or height, or by a scale")
    sub.add_argument("--width", type=int)
    sub.add_argument("--height", type=int)
    sub.add_argument("--scale", type=float, help="e.g. 0.5 for half size")
    sub = command("crop", "cut out a box")
    box = ("LEFT", "TOP", "RIGHT", "BOTTOM")
    sub.add_argument("--box", type=int, nargs=4, required=True, metavar=box)
    sub = command("rotate", "rotate counter-clockwise by DEGREES (negative: clockwise)")
    sub.add_argument("--degrees", type=float, required=True)
    sub.add_argument("--fill", default=None, help="colour of the new corners, e.g. white")
    command("convert", "change the format (from the output file's extension)")
    args = parser.parse_args()

    with Image.open(args.input) as image:
        if args.command == "info":
            print(f"{image.format} {image.width}x{image.height} {image.mode}")
            return
        operations = {"resize": resize, "crop": crop, "rotate": rotate}
        result = operations[args.command](image, args) if args.command in operations else image
        save(result, args.output, args.quality)


if __name__ == "__main__":
    main()
