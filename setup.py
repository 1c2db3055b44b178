"""Build the Cython hot path (sources in cython/) into private modules rdmasched._*, and
compile the scheduler's policy (rdmasched/scheduler/core.py, plain Python with an augmenting
core.pxd beside it, and its Task, task.py with task.pxd) so it runs at a million decisions a
second, and the node core that drives it (rdmasched/daemon/core.py with its core.pxd); without
the build the same files run as Python.

Cython warnings are errors, and so are the C compiler's. The verbs module is built only where
libibverbs' headers are installed (Debian: libibverbs-dev); without it rdmasched still works
on the shm transport and `rdmasched doctor` says why verbs is missing. Likewise the callgrind
client requests (rdmasched._callgrind, for `rdmasched bench stages`) need valgrind's headers.
"""

import os
import sys

from Cython.Build import cythonize
from Cython.Compiler import Options
from setuptools import Extension, setup

Options.warning_errors = True

CFLAGS = ["-O3", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function", "-Wno-unused-parameter"]
INCLUDE = ["cython/rdmasched"]


def ext(name, libraries=()):
    return Extension(
        f"rdmasched.{name}",
        [f"cython/rdmasched/{name}.pyx"],
        include_dirs=INCLUDE,
        extra_compile_args=CFLAGS,
        libraries=list(libraries),
    )


def have_verbs():
    return os.path.exists("/usr/include/infiniband/verbs.h")


def have_valgrind():
    return os.path.exists("/usr/include/valgrind/callgrind.h")


# the scheduler's Task (task.py + task.pxd) is compiled too: the core reads its fields as C
# struct members instead of through Python attribute lookup
extensions = [ext("_wire"), ext("_ring"), ext("_shm"), ext("_bench"),
              Extension("rdmasched.scheduler.task", ["rdmasched/scheduler/task.py"],
                        extra_compile_args=CFLAGS),
              Extension("rdmasched.scheduler.core", ["rdmasched/scheduler/core.py"],
                        extra_compile_args=CFLAGS),
              # the node core (daemon/core.py + core.pxd): receive's fast path calls the
              # compiled scheduler's typed methods and reads Message fields as C members
              Extension("rdmasched.daemon.core", ["rdmasched/daemon/core.py"],
                        include_dirs=INCLUDE, extra_compile_args=CFLAGS)]
if os.path.exists("cython/rdmasched/_verbs.pyx"):
    if have_verbs():
        extensions.append(ext("_verbs", libraries=["ibverbs"]))
    else:
        print("setup.py: libibverbs headers not found; building without the verbs transport "
              "(apt-get install libibverbs-dev)", file=sys.stderr)

if have_valgrind():
    extensions.append(ext("_callgrind"))
else:
    print("setup.py: valgrind headers not found; building without rdmasched._callgrind "
          "(`rdmasched bench stages` needs it: apt-get install valgrind)", file=sys.stderr)

setup(
    ext_modules=cythonize(
        extensions,
        include_path=["cython"],
        compiler_directives={"language_level": 3, "embedsignature": True},
        annotate=False,
    ),
)
