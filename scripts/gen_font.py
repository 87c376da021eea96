#!/usr/bin/env python3
"""Renders the chart fonts (training/font_dejavu.cc): printable ASCII of DejaVu Sans as 8-bit
coverage bitmaps, once, so that meshcast draws anti-aliased text with no font file or FreeType at
run time.

    python3 scripts/gen_font.py [OUTPUT]      (default: training/font_dejavu.cc)

Needs Pillow with FreeType (Debian: python3-pil) and fonts-dejavu-core. Glyphs are rendered
hinted (FreeType's default, so that stems fall on whole pixels and stay crisp at small sizes) with
Pillow's basic layout: integer advances, no kerning. The output is deterministic for a given font
file and FreeType version, and formatted as clang-format leaves it.
"""
import os
import sys

from PIL import Image, ImageDraw, ImageFont, features

FONT_DIR = "/usr/share/fonts/truetype/dejavu"
FONT_FILE = "DejaVuSans.ttf"
# (C++ name, pixel size, use)
FACES = [
    ("kLabel", 13, "tick labels, axis labels, legends"),
    ("kTitle", 17, "titles"),
]
FIRST, LAST = 32, 126  # ' ' .. '~'

# The Bitstream Vera license (DejaVu's changes are public domain), from
# /usr/share/doc/fonts-dejavu-core/copyright: its notices must accompany copies of the glyphs.
LICENSE = """\
Copyright (c) 2003 by Bitstream, Inc. All Rights Reserved. Bitstream Vera is a trademark of
Bitstream, Inc. DejaVu changes are in public domain.

Permission is hereby granted, free of charge, to any person obtaining a copy of the fonts
accompanying this license ("Fonts") and associated documentation files (the "Font Software"), to
reproduce and distribute the Font Software, including without limitation the rights to use,
copy, merge, publish, distribute, and/or sell copies of the Font Software, and to permit persons
to whom the Font Software is furnished to do so, subject to the following conditions:

The above copyright and trademark notices and this permission notice shall be included in all
copies of one or more of the Font Software typefaces.

The Font Software may be modified, altered, or added to, and in particular the designs of glyphs
or characters in the Fonts may be modified and additional glyphs or characters may be added to
the Fonts, only if the fonts are renamed to names not containing either the words "Bitstream" or
the word "Vera".

This License becomes null and void to the extent applicable to Fonts or Font Software that has
been modified and is distributed under the "Bitstream Vera" names.

The Font Software may be sold as part of a larger software package but no copy of one or more of
the Font Software typefaces may be sold by itself.

THE FONT SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
INCLUDING BUT NOT LIMITED TO ANY WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE
AND NONINFRINGEMENT OF COPYRIGHT, PATENT, TRADEMARK, OR OTHER RIGHT. IN NO EVENT SHALL BITSTREAM
OR THE GNOME FOUNDATION BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, INCLUDING ANY
GENERAL, SPECIAL, INDIRECT, INCIDENTAL, OR CONSEQUENTIAL DAMAGES, WHETHER IN AN ACTION OF
CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF THE USE OR INABILITY TO USE THE FONT SOFTWARE
OR FROM OTHER DEALINGS IN THE FONT SOFTWARE.

Except as contained in this notice, the names of Gnome, the Gnome Foundation, and Bitstream Inc.,
shall not be used in advertising or otherwise to promote the sale, use or other dealings in this
Font Software without prior written authorization from the Gnome Foundation or Bitstream Inc.,
respectively. For further information, contact: fonts at gnome dot org."""


def render(font, size, ch):
    """(width, height, left, top, advance, coverage bytes): the glyph's ink box, its offset from
    the pen on the baseline (top < 0 is above it), and how far the pen moves."""
    canvas = Image.new("L", (4 * size, 4 * size), 0)
    ox, oy = size, 3 * size  # the pen, on the baseline
    ImageDraw.Draw(canvas).text((ox, oy), ch, font=font, fill=255, anchor="ls")
    advance = font.getlength(ch)
    if advance != int(advance):
        sys.exit(f"gen_font: {ch!r} at {size} px advances by {advance}, not a whole pixel")
    box = canvas.getbbox()
    if box is None:
        return 0, 0, 0, 0, int(advance), b""
    x0, y0, x1, y1 = box
    return x1 - x0, y1 - y0, x0 - ox, y0 - oy, int(advance), canvas.crop(box).tobytes()


def face_source(name, size, use):
    """The face's arrays (C++ source) and the definition of its Face."""
    font = ImageFont.truetype(os.path.join(FONT_DIR, FONT_FILE), size,
                              layout_engine=ImageFont.Layout.BASIC)
    ascent, descent = font.getmetrics()
    glyphs, coverage = [], bytearray()
    for code in range(FIRST, LAST + 1):
        w, h, left, top, advance, data = render(font, size, chr(code))
        glyphs.append((len(coverage), w, h, left, top, advance, chr(code)))
        coverage += data
    cap = -render(font, size, "H")[3]
    lines = [f"// DejaVu Sans {size} px: {use}."]
    lines.append(f"constexpr std::uint8_t {name}Coverage[] = {{")
    row = "   "
    for b in coverage:
        if len(row) + len(f" {b},") > 100:
            lines.append(row)
            row = "   "
        row += f" {b},"
    lines.append(row)
    lines.append("};")
    lines.append(f"constexpr Glyph {name}Glyphs[] = {{")
    for offset, w, h, left, top, advance, ch in glyphs:
        comment = "' '" if ch == " " else ch.replace("\\", "backslash")
        lines.append(f"    {{{offset}, {w}, {h}, {left}, {top}, {advance}}},  // {comment}")
    lines.append("};")
    definition = (f"constinit const Face {name}{{{size}, {ascent}, {descent}, {cap}, "
                  f"{name}Glyphs, {name}Coverage}};")
    return "\n".join(lines), definition


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "training", "font_dejavu.cc")
    header = [
        "// Generated by scripts/gen_font.py; do not edit: rerun it.",
        f"// Printable ASCII of {FONT_FILE} ({FONT_DIR}, Debian's fonts-dejavu-core),",
        f"// rendered hinted by Pillow {Image.__version__} with FreeType"
        f" {features.version('freetype2')} as 8-bit coverage.",
        "//",
        "// The glyphs come from the DejaVu fonts, under the Bitstream Vera license:",
        "//",
    ]
    header += ["//" + (" " + line if line else "") for line in LICENSE.splitlines()]
    faces = [face_source(*f) for f in FACES]
    body = [
        '#include "training/font.h"',
        "",
        "namespace meshcast::training::font {",
        "namespace {",
        "",
        "// clang-format off",
        "\n\n".join(arrays for arrays, _ in faces),
        "// clang-format on",
        "",
        "}  // namespace",
        "",
        *(definition for _, definition in faces),
        "",
        "}  // namespace meshcast::training::font",
    ]
    with open(out, "w") as f:
        f.write("\n".join(header + [""] + body) + "\n")


if __name__ == "__main__":
    main()
