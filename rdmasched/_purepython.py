"""The pure-Python switch of the compiled cores (as msgpack's ``MSGPACK_PUREPYTHON``).

``rdmasched.scheduler.core``, ``rdmasched.scheduler.task`` and ``rdmasched.daemon.core`` are
each a ``.py`` that setup.py also compiles in place, to a ``.so`` beside it: a plain import
picks the ``.so``. With ``RDMASCHED_PUREPYTHON`` set (to anything but "" or "0") when the
package is imported, its ``__init__`` loads the ``.py`` sources instead, into
``sys.modules`` under the modules' own names, before anything imports them: a user can
always check the compiled path against the readable one. Each module's ``IMPLEMENTATION``
("compiled" or "python") says which was loaded (docs/SCHEDULER.md).
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from types import ModuleType

#: the environment variable that selects the Python sources, read at import time
ENV = "RDMASCHED_PUREPYTHON"


def wanted() -> bool:
    """True when the environment asks for the Python sources of the compiled modules."""
    return os.environ.get(ENV, "") not in ("", "0")


def load_source(package: ModuleType, name: str) -> ModuleType:
    """``package.name`` from its ``.py`` source even where its compiled module is built (or
    the module already loaded, if something imported it first)."""
    full = f"{package.__name__}.{name}"
    got = sys.modules.get(full)
    if got is not None:
        return got
    path = os.path.join(os.path.dirname(str(package.__file__)), f"{name}.py")
    loader = SourceFileLoader(full, path)
    spec = spec_from_loader(full, loader)
    if spec is None:  # (never for a SourceFileLoader; for the type checker)
        raise ImportError(f"no module spec for {path}")
    module = module_from_spec(spec)
    sys.modules[full] = module
    try:
        loader.exec_module(module)
    except BaseException:
        del sys.modules[full]
        raise
    setattr(package, name, module)
    return module
