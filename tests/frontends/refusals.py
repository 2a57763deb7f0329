"""config.json mistakes as the HF frontend reports them: one SpecError whose message names
the file (with the key's line where the key is written), the key and what is wrong. No
transformers needed."""
import json
from typing import Optional

import pytest

from frontends import load_spec
from irc.errors import SpecError


def refused(folder, key: str, fragment: str, config: Optional[dict] = None) -> str:
    """``load_spec(folder)`` refused with one SpecError naming ``folder``'s config.json (written
    first from ``config`` where given), ``key`` and ``fragment``: the message."""
    path = folder / "config.json"
    if config is not None:
        path.write_text(json.dumps(config, indent=2))
    with pytest.raises(SpecError) as err:
        load_spec(folder)
    message = str(err.value)
    assert f"{path}:" in message and f"{key}: " in message and fragment in message, message
    return message


def pointed_line(folder, message: str) -> str:
    """The line of ``folder``'s config.json that ``message`` points at."""
    line = int(message.split("config.json:")[1].split(":")[0])
    return (folder / "config.json").read_text().splitlines()[line - 1]


def refused_change(folder, out, key: str, value, match: str) -> None:
    """``folder``'s config.json with ``key`` set to ``value``, written into ``out``: loading it
    raises a SpecError matching ``match`` that names config.json."""
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    (out / "config.json").write_text(json.dumps(config, indent=2))
    with pytest.raises(SpecError, match=match) as err:
        load_spec(out)
    assert "config.json" in str(err.value)


def refused_changes(folder, out, change: dict, message: str) -> None:
    """``folder``'s config.json with ``change`` (a dict value updates that key's object),
    written into ``out``: loading it raises a SpecError holding ``message`` and naming
    config.json."""
    config = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    (out / "config.json").write_text(json.dumps(config, indent=2))
    with pytest.raises(SpecError) as err:
        load_spec(out)
    assert message in str(err.value) and "config.json:" in str(err.value)
