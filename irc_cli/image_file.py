"""An image file as the processors take it: decoded by Pillow (imported only here, when an
image is read: ``pip install 'irc[vision]'``), at most ``MAX_PIXELS``, made RGB. A file that is
not an image is one ``IRCError`` naming it."""
from __future__ import annotations

import os

from irc.errors import IRCError

MAX_PIXELS = 1 << 26  # 67 megapixels: larger files are refused before they are decoded


def to_rgb(image):
    """RGB, transparency composited onto white (transformers' convert_to_rgb)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), image).convert("RGB")
    return image.convert("RGB")


def read_image(path: str):
    """The Pillow image at ``path``, decoded (one IRCError naming the file otherwise)."""
    try:
        from PIL import Image
    except ImportError:
        raise IRCError("reading images needs Pillow", hint="pip install 'irc[vision]'") from None
    if not os.path.isfile(path):
        raise IRCError("no such image file", location=path)
    try:
        with Image.open(path) as opened:  # reads the header only
            if opened.width * opened.height > MAX_PIXELS:
                raise IRCError(f"{opened.width}x{opened.height} pixels is over irc's limit of {MAX_PIXELS:,}",
                               location=path, hint="resize the image first")
            opened.load()
            return opened.copy()
    except IRCError:
        raise
    except (OSError, ValueError, Image.DecompressionBombError, SyntaxError) as err:
        raise IRCError(f"not an image Pillow can read: {err}", location=path) from None
