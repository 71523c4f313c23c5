"""Load user code named on the command line or in a config: ``module:attr`` or
``path/to/file.py:attr``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from boltrl.errors import InvalidInput

_FORM = "must look like 'module:function' or 'file.py:function'"


def load_object(spec: str, *, what: str = "object") -> Any:
    """Import ``module.sub:attr`` or ``some/file.py:attr`` (attr may be dotted).

    Raises ``InvalidInput`` naming the spec and what went wrong.
    """
    if ":" not in spec:
        raise InvalidInput(
            f"{what} {spec!r} must look like 'module:function' or 'file.py:function'"
        )
    mod_name, _, attr = spec.rpartition(":")
    if not mod_name or not attr:
        raise InvalidInput(
            f"{what} {spec!r} must look like 'module:function' or 'file.py:function'"
        )
    try:
        if mod_name.endswith(".py") or "/" in mod_name:
            path = Path(mod_name).resolve()
            if not path.is_file():
                raise InvalidInput(f"{what} {spec!r}: file {path} does not exist")
            name = f"_boltrl_user_{path.stem}_{abs(hash(str(path)))}"
            module = sys.modules.get(name)
            if module is None:
                sp = importlib.util.spec_from_file_location(name, path)
                if sp is None or sp.loader is None:
                    raise InvalidInput(f"{what} {spec!r}: cannot import {path}")
                module = importlib.util.module_from_spec(sp)
                sys.modules[name] = module
                # let the file import its siblings, as `python file.py` would
                sys.path.insert(0, str(path.parent))
                sp.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except InvalidInput:
        raise
    except ImportError as e:
        raise InvalidInput(f"{what} {spec!r}: cannot import {mod_name!r}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidInput(f"{what} {spec!r}: {mod_name!r} has no attribute {attr!r}") from None
    return obj
