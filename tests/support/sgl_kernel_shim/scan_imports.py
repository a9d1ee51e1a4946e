"""List the ``sgl_kernel`` symbols an SGLang install reads at import time on CPU: every
``from sgl_kernel... import`` and ``torch.ops.sgl_kernel.X`` outside a function body, with the ``if`` conditions
around it.  Those under a plain CPU condition (no AMX gate) are what ``sgl_kernel/__init__.py`` beside this file
must supply; re-run it on an SGLang upgrade:

    SGL=$(python -c 'import os, sglang; print(os.path.dirname(sglang.__file__))')
    python tests/support/sgl_kernel_shim/scan_imports.py "$SGL"
"""
import ast
import pathlib
import sys


def scan(root: pathlib.Path):
    for p in sorted(root.rglob("*.py")):
        if "multimodal_gen" in p.parts:          # the diffusion runtime, not the LLM server
            continue
        try:
            tree = ast.parse(p.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        yield from _walk(p.relative_to(root), tree.body, [])


def _walk(path, nodes, cond):
    for n in nodes:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(n, ast.ClassDef):
            yield from _walk(path, n.body, cond)
        elif isinstance(n, ast.If):
            t = ast.unparse(n.test)
            yield from _walk(path, n.body, cond + [t])
            yield from _walk(path, n.orelse, cond + [f"not ({t})"])
        elif isinstance(n, ast.Try):
            for body in (n.body, *(h.body for h in n.handlers), n.orelse, n.finalbody):
                yield from _walk(path, body, cond)
        else:
            for sub in ast.walk(n):
                if isinstance(sub, ast.ImportFrom) and (sub.module or "").startswith("sgl_kernel"):
                    for a in sub.names:
                        yield f"{path}:{sub.lineno}", f"{sub.module}.{a.name}", cond
                elif (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute)
                      and ast.unparse(sub.value) == "torch.ops.sgl_kernel"):
                    yield f"{path}:{sub.lineno}", f"torch.ops.sgl_kernel.{sub.attr}", cond


if __name__ == "__main__":
    for where, name, cond in scan(pathlib.Path(sys.argv[1])):
        if any("cpu" in c.lower() for c in cond):
            print(f"{where}\t{name}\t[{' & '.join(cond)}]")
