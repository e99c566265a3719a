"""Rename-edit examples for the speculative-decoding target's corpus (issue 40).

Code models learn to rewrite a file with a small change from commit and
instruction data; a target trained on plain source never sees a document
quoted back with an edit, so it has no reason to copy and prompt lookup has
nothing to find. These examples teach the copy: a function or method of a
training file, then the same function with one local name renamed, in the
markdown shape a user's edit request takes:

    ### name.py
    ```python
    <function>
    ```

    ### name.py with `old` renamed to `new`
    ```python
    <function with old -> new>
    ```

Only training files are used (never held-out ones), and the functions are
short enough (at most MAX_CHARS) that the original sits inside a training
window of 256 tokens while the copy is predicted.
"""
import ast
import builtins
import keyword
import os
import re
import textwrap

MIN_CHARS = 120
MAX_CHARS = 600
# Plausible replacement names; a pair uses one that its function does not contain.
NEW_NAMES = ("people", "items", "entries", "rows", "values", "result", "records", "names",
             "total", "index", "buffer", "text", "lines", "node", "item", "config", "options",
             "size", "length", "target", "source", "parts", "chunk", "counter", "mapping",
             "handle", "stream", "payload", "element", "current")
RESERVED = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls"}


def local_names(fn):
    """Argument and variable names used inside fn, in first-seen order."""
    seen = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.arg):
            seen.setdefault(node.arg, None)
        elif isinstance(node, ast.Name):
            seen.setdefault(node.id, None)
    return list(seen)


def rename_candidates(fn, src):
    out = []
    for name in local_names(fn):
        if len(name) < 3 or name in RESERVED or name == fn.name:
            continue
        if len(re.findall(rf"\b{re.escape(name)}\b", src)) >= 2:
            out.append(name)
    return out


def outer_functions(text):
    """Functions of the module body and methods of its classes (not nested functions)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    bodies = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    return [n for body in bodies for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def render(base, old, new, src, edited):
    return (f"### {base}\n```python\n{src}\n```\n\n"
            f"### {base} with `{old}` renamed to `{new}`\n```python\n{edited}\n```\n")


def edit_pairs(rel, text, rng, max_pairs):
    """Up to max_pairs rename-edit documents from one file's top-level functions."""
    if max_pairs <= 0:
        return []
    lines = text.splitlines()
    functions = outer_functions(text)
    rng.shuffle(functions)
    out = []
    for fn in functions:
        # Methods come dedented, as a user quoting one would paste it.
        src = textwrap.dedent("\n".join(lines[fn.lineno - 1:fn.end_lineno]))
        if not MIN_CHARS <= len(src) <= MAX_CHARS:
            continue
        candidates = rename_candidates(fn, src)
        fresh = [n for n in NEW_NAMES if not re.search(rf"\b{n}\b", src)]
        if not candidates or not fresh:
            continue
        old, new = rng.choice(candidates), rng.choice(fresh)
        edited = re.sub(rf"\b{re.escape(old)}\b", new, src)
        out.append(render(os.path.basename(rel), old, new, src, edited))
        if len(out) >= max_pairs:
            break
    return out
