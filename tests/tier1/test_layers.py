"""The package's import structure: no circle, and no import up the layers.

The layers are written once, in docs/ARCHITECTURE.md ("Layers"); this test reads the same
table from there, parses every module's imports (inside functions too; not those under
`if TYPE_CHECKING:`, which never run) and fails on any circle and on any import of a module
in a higher layer, but the one named exception below.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.tier1

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "rdmasched"
DOC = ROOT / "docs" / "ARCHITECTURE.md"

#: The one import up the layers: the namespace `rdmasched` re-exports the public API
#: (`Node`, `Client`, `LATER`, ...) lazily, in its module `__getattr__`, so that
#: `import rdmasched.wire` does not load the daemon. It runs only when a user asks for one
#: of those names, never while the package imports.
ALLOWED_UP = {("rdmasched", "__getattr__")}


def modules() -> dict[str, Path]:
    mods = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(name: str, path: Path) -> Iterator[tuple[str, str | None]]:
    """(imported module or name, the enclosing function or None) for every import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def walk(node: ast.AST, fn: str | None) -> Iterator[tuple[str, str | None]]:
        if _type_checking(node):
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = fn or node.name
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, fn
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                yield f"{base}.{a.name}", fn
            yield base, fn
        for child in ast.iter_child_nodes(node):
            yield from walk(child, fn)

    yield from walk(ast.parse(path.read_text()), None)


def graph() -> dict[str, set[tuple[str, str | None]]]:
    mods = modules()
    edges: dict[str, set[tuple[str, str | None]]] = {m: set() for m in mods}
    for m, p in mods.items():
        for target, fn in imports(m, p):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if not target or target == m:
                continue
            # importing a package's own __init__ from inside it is how Python imports it
            if m.startswith(target + ".") and mods[target].name == "__init__.py":
                continue
            edges[m].add((target, fn))
    return edges


def layers() -> list[tuple[int, str]]:
    """(layer number, module prefix) rows of ARCHITECTURE.md's layer table."""
    rows = []
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| (\d+) \| [^|]+ \| (.+?) \|", line)
        if m:
            for prefix in re.findall(r"`([\w.]+)`", m.group(2)):
                rows.append((int(m.group(1)), prefix))
    return rows


def layer_of(module: str, rows: list[tuple[int, str]]) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for n, prefix in rows:
        # the namespace `rdmasched` is a row of its own, not a prefix of every module
        matches = module == prefix or (prefix != "rdmasched" and module.startswith(prefix + "."))
        if matches and (best is None or len(prefix) > best[0]):
            best = (len(prefix), n)
    if best is None:
        raise AssertionError(f"{module} is in no layer of docs/ARCHITECTURE.md")
    return best[1]


def test_every_module_has_a_layer() -> None:
    rows = layers()
    assert rows, "docs/ARCHITECTURE.md has no layer table"
    for m in modules():
        layer_of(m, rows)


def test_no_import_circle() -> None:
    edges = {m: {t for t, _ in ts} for m, ts in graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_no_import_up_the_layers() -> None:
    rows = layers()
    up = []
    for m, targets in graph().items():
        for t, fn in targets:
            if layer_of(t, rows) > layer_of(m, rows) and (m, fn) not in ALLOWED_UP:
                up.append(
                    f"{m} (layer {layer_of(m, rows)}) imports {t} (layer {layer_of(t, rows)})"
                )
    assert not up, "imports up the layers:\n" + "\n".join(sorted(up))


def test_the_one_exception_is_still_needed() -> None:
    """The allowed import up exists (else the exception should go)."""
    rows = layers()
    used = {
        (m, fn)
        for m, targets in graph().items()
        for t, fn in targets
        if layer_of(t, rows) > layer_of(m, rows)
    }
    assert used >= ALLOWED_UP
