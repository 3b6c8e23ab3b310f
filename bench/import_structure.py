"""The package's import structure: which parts import which, the cycles among them, and the imports that go up the
layers (a lower layer reaching into a higher one). Module-level and in-function imports both count.

    python bench/import_structure.py [--root taps_train] [--rev REV]   # --rev: a commit's tree, read with git

Layers, lowest first: shared modules at the package root (errors, paths, files, ...), verifier, data, drafter,
decoding, training, eval, tracking, export, engine, study, commands (cli); a part is a module's first path component.
"""

import argparse
import ast
import subprocess
from collections import defaultdict
from pathlib import PurePosixPath

LAYERS = ["(root)", "verifier", "data", "drafter", "decoding", "training", "eval", "tracking", "export", "engine", "study", "commands"]
# Root modules that are parts of their own (or of a layer above the shared modules); `spec` is the decoder's former name.
ALIASES = {"spec": "decoding", "speculators": "export", "backbones": "training", "cli": "commands", "__main__": "commands",
           "tracking": "tracking", "export": "export"}


def sources(root: str, rev: str | None) -> dict[str, str]:
    if rev is None:
        from pathlib import Path

        return {str(p): p.read_text() for p in Path(root).rglob("*.py")}
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, root], capture_output=True, text=True, check=True).stdout.split()
    return {name: subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, text=True, check=True).stdout
            for name in names if name.endswith(".py")}


def part(module: str, packages: set[str]) -> str:
    """`taps_train.eval.report` and `taps_train.eval` -> `eval`; shared root modules -> `(root)`."""
    pieces = module.split(".")[1:]
    if not pieces:
        return "(root)"
    if len(pieces) == 1 and pieces[0] not in packages:
        return ALIASES.get(pieces[0], "(root)")
    return ALIASES.get(pieces[0], pieces[0])


def graph(root: str, rev: str | None) -> dict[tuple[str, str], int]:
    edges: dict[tuple[str, str], int] = defaultdict(int)
    files = sources(root, rev)
    packages = {PurePosixPath(path).parts[1] for path in files if len(PurePosixPath(path).parts) > 2}
    for path, text in files.items():
        module = ".".join(PurePosixPath(path).with_suffix("").parts).removesuffix(".__init__")
        source = part(module, packages)
        for node in ast.walk(ast.parse(text)):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(root):
                targets = [node.module] if node.module != root else [f"{root}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith(root + ".")]
            for target in targets:
                other = part(target, packages)
                if other != source:
                    edges[source, other] += 1
    return edges


def cycles(edges: dict[tuple[str, str], int]) -> list[list[str]]:
    """Strongly connected components of more than one part (Tarjan)."""
    nodes = sorted({n for edge in edges for n in edge})
    succ = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in nodes:
        if v not in index:
            visit(v)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="taps_train")
    parser.add_argument("--rev", default=None)
    args = parser.parse_args()
    edges = graph(args.root, args.rev)
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted((a, b, n) for (a, b), n in edges.items() if rank.get(a, 0) < rank.get(b, 0))
    print(f"{args.rev or 'working tree'}: {len(edges)} part-to-part edges, {sum(edges.values())} imports")
    print(f"upward imports ({sum(n for *_, n in upward)} in {len(upward)} edges): " + ", ".join(f"{a} -> {b} ({n})" for a, b, n in upward))
    found = cycles(edges)
    print(f"cycles ({len(found)}): " + "; ".join(" <-> ".join(c) for c in found))


if __name__ == "__main__":
    main()
