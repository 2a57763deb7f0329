"""What the image processor tests share: odd-sized random images and a processor config
written to a folder."""
import json

import numpy as np

from irc_cli import images


def odd_image(width: int, height: int):
    """A random RGB image of width x height, seeded by its size."""
    from PIL import Image

    data = np.random.default_rng(width * height).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(data, "RGB")


def written(folder, config: dict) -> str:
    """``folder`` holding ``config`` as its preprocessor_config.json."""
    folder.mkdir(exist_ok=True)
    (folder / images.PREPROCESSOR).write_text(json.dumps(config))
    return str(folder)
