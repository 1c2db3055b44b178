"""The node daemon: the sans-IO node core (core.py), its threaded driver (node.py), the loop
and the protocols they run (docs/DAEMON.md).

``core`` is compiled where built; with RDMASCHED_PUREPYTHON set its Python source is loaded
instead, as the scheduler's are (rdmasched/_purepython.py); ``core.IMPLEMENTATION`` says
which ("compiled" or "python").
"""

import sys

from rdmasched import _purepython

if _purepython.wanted():
    from rdmasched import scheduler  # (its own switch first: a plain core needs a plain one)

    if scheduler.IMPLEMENTATION != "python":  # (imported before the variable was set)
        raise ImportError(f"{_purepython.ENV} is set but the compiled scheduler is loaded")
    _purepython.load_source(sys.modules[__name__], "core")
