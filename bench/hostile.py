"""Hostile-input run (issue 12: "every bad input a clear line, nothing silent").

Generates a few hundred hostile inputs in a temp directory (data files, recipes, verifier directories,
checkpoints, eval/export/average/report options) and runs each against the CLI in-process
(`taps_train.cli.main(argv)`), classifying the outcome:

  clear      expected failure: non-zero exit, one `error:` line that names the offending file/option
  survived   expected (or tolerated) success: exit 0 and the case's check of the result passed
  traceback  an exception other than SystemExit escaped main(), "Traceback" on stderr, a multi-line error,
             or the per-case time limit was hit
  silent     exit 0 where an error was expected, or exit 0 with a wrong result (check failed)
  unclear    non-zero exit with an error line that does not name the file/option
  refused    expected success, but it exited non-zero with a clean one-line error (a false refusal)

    python bench/hostile.py [--only FAMILY ...] [--json out.json] [--keep] [--timeout 60]
    PYTHONPATH=/tmp/base python bench/hostile.py      # an older checkout, for a before/after table

Commands or options an older version lacks count as whatever outcome they produce.
"""

import argparse
import contextlib
import gzip
import io
import json
import math
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

import taps_train  # noqa: E402
from taps_train.cli import main  # noqa: E402

CATEGORIES = ("clear", "survived", "traceback", "silent", "unclear", "refused")


# ----------------------------------------------------------------------------------------------- cases

@dataclass
class Ctx:
    """What every case may use: its own directory, the shared random verifier and a good checkpoint."""

    root: Path
    d: Path = None  # the case's own directory
    verifier: str = ""
    verifier_dir: Path = None
    ckpt: str = ""
    ckpt2: str = ""
    report: str = ""
    good_data: str = ""
    good_recipe: str = ""
    marker: Path = None

    def p(self, name: str) -> str:
        return str(self.d / name)


@dataclass
class Case:
    family: str
    name: str
    argv: Callable[[Ctx], list[str]]
    files: Callable[[Ctx], None] | None = None  # creates the case's inputs under ctx.d
    expect: str = "error"  # error | ok | either
    names: Callable[[Ctx], list[str]] | None = None  # any of these must appear in the error line
    check: Callable[[Ctx, str], str | None] | None = None  # stdout -> None when right, else what is wrong
    marker: bool = False  # fail (silent) if ctx.marker exists afterwards: code ran that never should
    env: Callable[[Ctx], dict] | None = None  # environment variables set for the case only
    check_stderr: bool = False  # `check` reads stderr (where progress and skip counts go), not stdout


CASES: list[Case] = []
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(  # a billion-element YAML alias bomb in ten lines
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def case(*args, **kwargs) -> None:
    CASES.append(Case(*args, **kwargs))


def write(path: str | Path, content: bytes | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content)


# --------------------------------------------------------------------------------------- data files

def good(i: int, form: str = "messages") -> dict:
    q, a = f"What is {i} plus {i + 3}?", f"It is {2 * i + 3}."
    if form == "sharegpt":
        return {"id": f"g{i}", "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
    return {"id": f"g{i}", "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def jl(*records) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def goods(n: int, start: int = 0) -> list[dict]:
    return [good(i) for i in range(start, start + n)]


def recipe_text(data_path: str, count: int = 1, heldout: int = 0, max_length: int = 256, extra: str = "") -> str:
    return (f"name: hostile\nseed: 0\nmax_length: {max_length}\nsources:\n  - source: jsonl\n"
            f"    args: {{path: {json.dumps(data_path)}}}\n    count: {count}\n    heldout: {heldout}\n{extra}")


def count_check(usable: int, read: int | None = None) -> Callable[[Ctx, str], str | None]:
    """The dry run's read report must account for every record: read - skipped - duplicates == usable."""

    def check(ctx: Ctx, out: str) -> str | None:
        m = re.search(r"(\d+) records read", out)
        if not m:
            return "no 'records read' line"
        got_read = int(m.group(1))
        # file-level problems (lines/elements that were not JSON) are not among the records read
        skipped = sum(int(n) for n, reason in re.findall(r"(\d+) skipped: ([^;\n]*)", out) if "JSON" not in reason)
        dup = sum(int(x) for x in re.findall(r"(\d+) duplicates dropped", out))
        if read is not None and got_read != read:
            return f"read {got_read} records, expected {read}"
        if got_read - skipped - dup != usable:
            return f"usable = {got_read} read - {skipped} skipped - {dup} dup = {got_read - skipped - dup}, expected {usable}"
        return None

    return check


def data_case(name: str, content, usable: int = 0, read: int | None = None, expect: str | None = None,
              filename: str | None = None, setup: Callable[[Ctx, str], None] | None = None, count: int | None = None) -> None:
    """A data file through a jsonl recipe: `cache --dry-run`. usable=0 means an error is expected."""
    filename = filename or f"{name}.jsonl"
    expect = expect or ("ok" if usable else "error")

    def files(ctx: Ctx) -> None:
        path = ctx.p(filename)
        if setup is not None:
            setup(ctx, path)
        else:
            write(path, content(ctx) if callable(content) else content)
        write(ctx.p("recipe.yaml"), recipe_text(path, count=count if count is not None else max(usable, 1)))

    case("data", name, lambda c: ["cache", "--dry-run", "--recipe", c.p("recipe.yaml"), "--verifier", c.verifier, "--cache-dir", c.p("cache")],
         files, expect, names=lambda c: [c.p(filename), filename], check=count_check(usable, read) if usable else None)


G3 = jl(*goods(3))
deep = "[" * 100_000 + "]" * 100_000
data_case("empty", b"")
data_case("whitespace_only", " \n\t\n   \r\n")
data_case("utf8_bom", "\ufeff" + G3, 3, 3)
data_case("utf8_bom_array", "\ufeff" + json.dumps(goods(3)), 3, 3, filename="utf8_bom_array.json")
data_case("utf16_bom", G3.encode("utf-16"))
data_case("utf16le_nobom", G3.encode("utf-16-le"))
data_case("utf32", G3.encode("utf-32"))
data_case("latin1_record", G3.encode() + json.dumps(good(9)).replace("plus", "pl\u00e9s").encode("latin-1") + b"\n", 3, 4)
data_case("binary_garbage", bytes((i * 7919 + 13) % 256 for i in range(4096)))
data_case("binary_then_good", bytes(range(256)) + b"\n" + G3.encode(), expect="either", usable=3)
data_case("gzip_named_jsonl", gzip.compress(G3.encode()))
data_case("jsonl_named_json", G3, 3, 3, filename="jsonl_named_json.json")
data_case("array_named_jsonl", json.dumps(goods(3)), 3, 3)
data_case("array_broken_middle", "[" + json.dumps(good(0)) + ", {\"messages\": [}, " + json.dumps(good(1)) + "]", 2, 2)
data_case("array_broken_bare_middle", "[" + json.dumps(good(0)) + ", tru, " + json.dumps(good(1)) + "]", 2, 2)
data_case("array_truncated_tail", json.dumps(goods(4))[:-40], 3, 3)
data_case("array_missing_close", json.dumps(goods(3))[:-1], 3, 3)
data_case("jsonl_truncated_tail", G3 + json.dumps(good(5))[:25], 3, 3)
data_case("u2028_in_string", jl(*goods(2), {"messages": [{"role": "user", "content": "a\u2028b"}, {"role": "assistant", "content": "c"}]}), 3, 3)
data_case("u2029_in_string", jl(*goods(2), {"messages": [{"role": "user", "content": "a\u2029b"}, {"role": "assistant", "content": "c"}]}), 3, 3)
data_case("u0085_in_string", jl(*goods(2), {"messages": [{"role": "user", "content": "a\u0085b"}, {"role": "assistant", "content": "c"}]}), 3, 3)
data_case("raw_u2028_json", G3.replace("?", "?\u2028"), 3, 3)
data_case("deep_nesting_line", G3 + deep + "\n", 3, None)
data_case("deep_nesting_array_elem", "[" + json.dumps(good(0)) + "," + deep + "," + json.dumps(good(1)) + "]", 2, None)
data_case("deep_nesting_whole_file", deep)
data_case("deep_object_nesting", G3 + '{"a":' * 50_000 + "1" + "}" * 50_000 + "\n", 3, None)
data_case("huge_single_line", jl(*goods(2), {"messages": [{"role": "user", "content": "x " * 1_000_000}, {"role": "assistant", "content": "ok"}]}), 3, 3)
data_case("records_null_number_list_string", jl(*goods(3), "null", "42", "[1, 2]", '"text"'), 3, 7)
data_case("only_nulls", "null\nnull\nnull\n")
data_case("array_of_nulls", "[null, null]")
data_case("array_of_arrays", json.dumps([[good(0)], [good(1)]]))
data_case("top_level_string", '"hello"')
data_case("top_level_number", "12345")
data_case("top_level_true", "true")
data_case("object_of_records", json.dumps({"a": good(0), "b": good(1)}))
data_case("single_object", json.dumps(good(0)), 1, 1)
data_case("missing_messages", jl(*goods(3), {"id": "x"}, {"text": "hello"}), 3, 5)
data_case("messages_is_dict", jl(*goods(3), {"messages": {"role": "user", "content": "hi"}}), 3, 4)
data_case("messages_empty_list", jl(*goods(3), {"messages": []}), 3, 4)
data_case("turn_is_string", jl(*goods(3), {"messages": ["hi", "there"]}), 3, 4)
data_case("wrong_role_names", jl(*goods(3), {"messages": [{"role": "customer", "content": "hi"}, {"role": "bot", "content": "yo"}]}), 3, 4)
data_case("role_number_null", jl(*goods(3), {"messages": [{"role": 1, "content": "hi"}, {"role": None, "content": "yo"}]}), 3, 4)
data_case("role_aliases_sharegpt", jl(*[good(i, "sharegpt") for i in range(3)]), 3, 3)
data_case("mixed_forms", jl(good(0), good(1, "sharegpt"), good(2)), 3, 3)
data_case("both_keys", jl(*goods(2), {"messages": good(7)["messages"], "conversations": "bogus"}), 3, 3)
data_case("empty_content", jl(*goods(3), {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}]}), 3, 4)
data_case("whitespace_content", jl(*goods(3), {"messages": [{"role": "user", "content": " \n\t"}, {"role": "assistant", "content": "x"}]}), 3, 4)
data_case("non_string_content", jl(*goods(3), *({"messages": [{"role": "user", "content": v}, {"role": "assistant", "content": "x"}]}
                                               for v in (5, None, ["a"], {"t": "a"}, True))), 3, 8)
data_case("only_assistant_turns", jl(*goods(3), {"messages": [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}), 3, 4)
data_case("only_user_turn", jl(*goods(3), {"messages": [{"role": "user", "content": "a"}]}), 3, 4)
data_case("system_only", jl(*goods(3), {"messages": [{"role": "system", "content": "a"}]}), 3, 4)
data_case("leading_assistant_turn", jl(*goods(3), {"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "q"},
                                                                 {"role": "assistant", "content": "a"}]}), 4, 4, expect="either")
data_case("duplicate_records", jl(*goods(3), good(0), good(1)), 3, 5)
data_case("same_id_different_content", jl(*[{**g, "id": "same"} for g in goods(3)]), 3, 3)
data_case("nan_infinity_extra_field", jl(*goods(2), '{"score": NaN, "w": Infinity, ' + json.dumps(good(8))[1:]), 3, 3, expect="either")
data_case("nan_as_content", jl(*goods(3), '{"messages": [{"role": "user", "content": NaN}, {"role": "assistant", "content": "x"}]}'), 3, 4)
data_case("trailing_comma_object", jl(*goods(3), json.dumps(good(5))[:-1] + ",}"), 3, 3)
data_case("trailing_comma_array", json.dumps(goods(3))[:-1] + ",]", 3, 3)
data_case("slash_comments", "// header comment\n" + G3 + "/* block */\n", 3, 3, expect="either")
data_case("hash_comments", "# generated\n" + G3, 3, 3, expect="either")
data_case("crlf_line_endings", G3.replace("\n", "\r\n"), 3, 3)
data_case("cr_only_line_endings", G3.replace("\n", "\r"), 3, 3, expect="either")
data_case("many_blank_lines", "\n" * 10_000 + G3 + "\n" * 10_000, 3, 3)
data_case("nul_bytes_between_lines", G3.replace("\n", "\n\x00\n"), 3, 3, expect="either")
data_case("escaped_nul_in_content", jl(*goods(3), {"messages": [{"role": "user", "content": "a\u0000b"}, {"role": "assistant", "content": "c"}]}), 4, 4, expect="either")
data_case("lone_surrogate_escape", jl(*goods(3), '{"messages": [{"role": "user", "content": "a\\ud800b"}, {"role": "assistant", "content": "c"}]}'), 3, 4, expect="either")
data_case("emoji_surrogate_pair", jl(*goods(3), '{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}, {"role": "assistant", "content": "c"}]}'), 4, 4)
data_case("bom_in_middle_line", G3 + "\ufeff" + json.dumps(good(7)) + "\n", 3, 3, expect="either")
data_case("garbage_after_array", json.dumps(goods(3)) + " trailing garbage", 3, 3, expect="either")
data_case("two_arrays_concatenated", json.dumps(goods(2)) + json.dumps(goods(2, 5)), 2, None, expect="either")
data_case("lone_comma_lines", G3.replace("\n", "\n,\n"), 3, 3, expect="either")
data_case("thousand_turns", jl(*goods(2), {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": f"t{i}"} for i in range(1000)]}), 3, 3)
data_case("five_thousand_records", jl(*goods(5000)), 5000, 5000)
data_case("invalid_utf8_in_role", G3.encode() + b'{"messages": [{"role": "us\xffer", "content": "a"}, {"role": "assistant", "content": "b"}]}\n', 3, 4)
data_case("vertical_tab_separator", G3.replace("\n", "\x0b\n"), 3, 3, expect="either")
data_case("count_larger_than_source", G3, 0, count=10)
data_case("unicode_filename", G3, 3, 3, filename="dätä ✓ file.jsonl")
data_case("a_directory", None, setup=lambda c, p: Path(p).mkdir())
data_case("missing_file", None, setup=lambda c, p: None)
data_case("fifo", None, setup=lambda c, p: os.mkfifo(p))
data_case("dev_null_symlink", None, setup=lambda c, p: os.symlink("/dev/null", p))
data_case("symlink_loop", None, setup=lambda c, p: (os.symlink(p + ".b", p), os.symlink(p, p + ".b")))
data_case("dangling_symlink", None, setup=lambda c, p: os.symlink(p + ".nowhere", p))
data_case("symlink_to_good", None, 3, 3, setup=lambda c, p: (write(p + ".real", G3), os.symlink(p + ".real", p)))
# root reads a chmod 000 file anyway; either outcome is fine as long as it is right
data_case("unreadable_chmod000", None, 3, 3, expect="either", setup=lambda c, p: (write(p, G3), os.chmod(p, 0)))


# ------------------------------------------------------------------------------------------- recipes

def recipe_case(name: str, text, expect: str = "error", names: list[str] | None = None, check=None, marker: bool = False,
                setup: Callable[[Ctx, str], None] | None = None) -> None:
    """`text` may use {data} (a 10-record data file) and {marker}."""

    def files(ctx: Ctx) -> None:
        path = ctx.p(f"{name}.yaml")
        if setup is not None:
            setup(ctx, path)
            return
        body = text(ctx) if callable(text) else text
        if isinstance(body, str):
            body = body.replace("{data}", json.dumps(ctx.good_data)).replace("{marker}", str(ctx.marker))
        write(path, body)

    case("recipe", name, lambda c: ["cache", "--dry-run", "--recipe", c.p(f"{name}.yaml"), "--verifier", c.verifier, "--cache-dir", c.p("cache")],
         files, expect, names=lambda c: [c.p(f"{name}.yaml"), f"{name}.yaml", *(names or [])],
         check=check or (count_check(10, 10) if expect != "error" else None), marker=marker)


SRC = "  - source: jsonl\n    args: {path: {data}}\n    count: 5\n    heldout: 2\n"


def R(top: str = "name: r\nseed: 0\nmax_length: 256\n", src: str = SRC) -> str:
    return top + "sources:\n" + src


recipe_case("baseline_ok", R(), "ok")
recipe_case("name_missing_ok", R("seed: 0\nmax_length: 256\n"), "ok")
recipe_case("json_recipe_ok", '{"name": "r", "max_length": 256, "sources": [{"source": "jsonl", "args": {"path": {data}}, "count": 5}]}', "ok")
recipe_case("merge_key_ok", "base: &b {source: jsonl, count: 5}\n", "error", ["base"])  # unknown top-level key
recipe_case("regenerate_true_dry_run", R(src=SRC + "    regenerate: true\n"), "ok")
recipe_case("regenerate_false", R(src=SRC + "    regenerate: false\n"), "ok")
for field_name, value in [("name", "123"), ("name", '""'), ("name", "[a, b]"), ("name", "null"),
                          ("max_length", "0"), ("max_length", "-1"), ("max_length", "1"), ('max_length', '"256"'), ("max_length", "256.5"),
                          ("max_length", "true"), ("max_length", "1e9"), ("max_length", "100000"), ("max_length", "null"), ("max_length", ".nan"),
                          ("seed", "null"), ("seed", "-1"), ("seed", '"0"'), ("seed", "1.5"), ("seed", str(2**64)), ("seed", "true"), ("seed", "[1]")]:
    top = {"name": "name: r\n", "seed": "seed: 0\n", "max_length": "max_length: 256\n"}
    top[field_name] = f"{field_name}: {value}\n"
    recipe_case(f"{field_name}_{re.sub(r'[^a-z0-9]+', '_', value.lower().replace('-', 'neg')).strip('_') or 'empty'}", R("".join(top.values())), names=[field_name])
recipe_case("max_length_default_beyond_context", R("name: r\nseed: 0\n"), names=["max_length"])
recipe_case("unknown_top_key", R() + "epochs: 3\n", names=["epochs"])
recipe_case("unknown_source_key", R(src=SRC + "    weight: 0.5\n"), names=["weight"])
recipe_case("duplicate_top_key", "seed: 0\n" + R(), names=["seed"])
recipe_case("duplicate_source_key", R(src=SRC + "    count: 6\n"), names=["count"])
recipe_case("duplicate_sources_key", R() + "sources: []\n", names=["sources"])
for label, src in [("missing", "  - args: {path: {data}}\n    count: 5\n"), ("unknown", "  - source: hub\n    count: 5\n"),
                   ("number", "  - source: 5\n    count: 5\n"), ("null", "  - source: null\n    count: 5\n"),
                   ("list", "  - source: [jsonl]\n    count: 5\n")]:
    recipe_case(f"source_{label}", R(src=src), names=["source"])
for label, src in [("none", "  - source: jsonl\n    args: {path: {data}}\n"), ("negative", SRC.replace("count: 5", "count: -1")),
                   ("string", SRC.replace("count: 5", 'count: "5"')), ("float", SRC.replace("count: 5", "count: 1.5")),
                   ("null", SRC.replace("count: 5", "count: null")), ("bool", SRC.replace("count: 5", "count: true")),
                   ("zero_both", SRC.replace("count: 5", "count: 0").replace("heldout: 2", "heldout: 0")),
                   ("larger_than_source", SRC.replace("count: 5", "count: 11")), ("huge", SRC.replace("count: 5", f"count: {10**12}")),
                   ("heldout_larger", SRC.replace("heldout: 2", "heldout: 9")), ("heldout_negative", SRC.replace("heldout: 2", "heldout: -2"))]:
    recipe_case(f"count_{label}", R(src=src), names=["count", "heldout", "jsonl"])
for label, args in [("missing", None), ("null", "null"), ("string", '"x"'), ("list", "[a]"), ("path_number", "{path: 5}"),
                    ("path_empty", '{path: ""}'), ("path_null", "{path: null}"), ("unknown_key", "{path: {data}, split: train}"),
                    ("path_missing_file", "{path: /nonexistent/hostile.jsonl}"), ("path_tilde", "{path: ~/nonexistent_hostile.jsonl}"),
                    ("path_list", "{path: [a, b]}")]:
    src = "  - source: jsonl\n" + (f"    args: {args}\n" if args is not None else "") + "    count: 5\n"
    recipe_case(f"args_{label}", R(src=src), names=["args", "path", "split", "hostile.jsonl"])
for label, args in [("size_negative", "{size: -1, seed: 1}"), ("size_string", "{size: x}"), ("size_zero", "{size: 0}"),
                    ("seed_negative", "{size: 50, seed: -1}"), ("unknown", "{size: 50, colour: red}")]:
    recipe_case(f"gsm_{label}", R(src=f"  - source: gsm_symbolic\n    args: {args}\n    count: 5\n"), names=["size", "seed", "colour"])
recipe_case("sharegpt_location_number", R(src="  - source: sharegpt\n    args: {location: 5}\n    count: 5\n"), names=["location"])
for label, value in [("string", '"yes"'), ("number", "5"), ("list", "[]"), ("temp_negative", "{temperature: -1}"),
                     ("temp_nan", "{temperature: .nan}"), ("temp_inf", "{temperature: .inf}"), ("temp_string", '{temperature: "hot"}'),
                     ("max_new_zero", "{max_new_tokens: 0}"), ("seed_null", "{seed: null}"), ("unknown", "{bogus: 1}")]:
    recipe_case(f"regenerate_{label}", R(src=SRC + f"    regenerate: {value}\n"), names=["regenerate", "temperature", "max_new_tokens", "seed", "bogus"])
recipe_case("python_object_apply", "!!python/object/apply:os.system ['touch {marker}']\n", marker=True)
recipe_case("python_object_apply_in_field", R("name: !!python/object/apply:os.system ['touch {marker}']\nseed: 0\nmax_length: 256\n"), marker=True)
recipe_case("python_name_tag", R("name: !!python/name:os.system\nseed: 0\nmax_length: 256\n"))
recipe_case("binary_tag_name", R("name: !!binary aGVsbG8=\nseed: 0\nmax_length: 256\n"), names=["name"])
recipe_case("anchor_bomb_small", "a: &a [x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b]\n"
            "d: &d [*c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d]\nname: [*e, *e, *e, *e, *e, *e]\n", names=["name", "a"])
recipe_case("anchor_bomb_in_sources", "a: &a [1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n"
            "sources: [*c, *c, *c, *c, *c, *c, *c, *c]\n", names=["a", "sources"])
recipe_case("not_a_mapping_list", "- source: jsonl\n")
recipe_case("not_a_mapping_scalar", "42\n")
recipe_case("not_a_mapping_string", "just some words\n")
recipe_case("empty_file", "")
recipe_case("only_comment", "# nothing here\n")
recipe_case("invalid_yaml_syntax", "name: [unclosed\nsources: {\n")
recipe_case("tab_indentation", "name: r\nsources:\n\t- source: jsonl\n")
recipe_case("non_utf8_bytes", b"name: r\xff\xfe\nsources: []\n")
recipe_case("utf16_recipe", R().encode("utf-16"), expect="either")
recipe_case("deeply_nested_yaml", "name: " + "[" * 20_000 + "]" * 20_000 + "\n")
recipe_case("sources_empty_list", R() .replace("sources:\n" + SRC, "sources: []\n").replace("{data}", "x"), names=["sources"])
recipe_case("sources_mapping", "name: r\nmax_length: 256\nsources: {source: jsonl}\n", names=["sources"])
recipe_case("sources_null_entry", "name: r\nmax_length: 256\nsources: [null]\n", names=["sources"])
recipe_case("non_string_key", R() + "1: 2\n", names=["1", "field names"])
recipe_case("a_directory", None, setup=lambda c, p: Path(p).mkdir())
recipe_case("missing_file", None, setup=lambda c, p: None)
recipe_case("symlink_loop", None, setup=lambda c, p: (os.symlink(p + ".b", p), os.symlink(p, p + ".b")))


# -------------------------------------------------------------------------------- verifier directories

def verifier_variant(ctx: Ctx, name: str, mutate) -> str:
    path = ctx.d / name
    if mutate is None:
        return str(path)
    if mutate != "empty" and mutate != "file":
        shutil.copytree(ctx.verifier_dir, path)
        mutate(ctx, path)
    elif mutate == "empty":
        path.mkdir()
    else:
        write(path, "not a directory\n")
    return str(path)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def auto_map(config_name: str):
    def mutate(ctx: Ctx, path: Path) -> None:
        write(path / "evil.py", f"open({str(ctx.marker)!r}, 'w').write('ran')\nfrom transformers import LlamaForCausalLM as EvilModel\n"
                                 "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n")
        key = {"config.json": ("AutoModelForCausalLM", "evil.EvilModel"), "tokenizer_config.json": ("AutoTokenizer", ["evil.EvilTokenizer", None])}
        edit_json(path / config_name, lambda d: d.__setitem__("auto_map", dict([key[config_name]])))
    return mutate


def to_bin(ctx: Ctx, path: Path) -> None:
    from safetensors.torch import load_file
    torch.save(load_file(path / "model.safetensors"), path / "pytorch_model.bin")
    (path / "model.safetensors").unlink()


def truncate(ctx: Ctx, path: Path) -> None:
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])


VERIFIER_VARIANTS = {
    "missing": None,
    "empty_dir": "empty",
    "a_file": "file",
    "config_garbage": lambda c, p: write(p / "config.json", b"\x00\x01garbage{"),
    "config_list": lambda c, p: write(p / "config.json", "[]"),
    "config_no_model_type": lambda c, p: edit_json(p / "config.json", lambda d: d.pop("model_type")),
    "config_no_hidden_size": lambda c, p: edit_json(p / "config.json", lambda d: d.pop("hidden_size")),
    "config_vocab_mismatch": lambda c, p: edit_json(p / "config.json", lambda d: d.__setitem__("vocab_size", d["vocab_size"] + 37)),
    "auto_map_config": auto_map("config.json"),
    "auto_map_tokenizer": auto_map("tokenizer_config.json"),
    "only_pytorch_model_bin": to_bin,
    "safetensors_truncated": truncate,
    "safetensors_garbage": lambda c, p: write(p / "model.safetensors", b"\xff" * 64),
    "safetensors_empty": lambda c, p: write(p / "model.safetensors", b""),
    "tokenizer_missing": lambda c, p: [f.unlink() for f in p.iterdir() if "token" in f.name or f.name == "chat_template.jinja"],
    "tokenizer_json_garbage": lambda c, p: write(p / "tokenizer.json", "{not json"),
}
for vname, mutate in VERIFIER_VARIANTS.items():
    for command in ("cache", "eval"):
        def files(ctx, vname=vname, mutate=mutate):
            verifier_variant(ctx, f"v_{vname}", mutate)
            write(ctx.p("recipe.yaml"), recipe_text(ctx.good_data, count=5))

        def argv(c, vname=vname, command=command):
            v = c.p(f"v_{vname}")
            if command == "cache":
                return ["cache", "--dry-run", "--recipe", c.p("recipe.yaml"), "--verifier", v, "--cache-dir", c.p("cache")]
            return ["eval", "--drafters", c.ckpt, "--verifier", v, "--benchmarks", f"gsm8k:{c.root / 'bench.jsonl'}", "--prompts", "1",
                    "--max-new-tokens", "4", "--output", c.p("out/report.json")]
        # `cache --dry-run` promises to run no verifier: damaged weights may pass it (a correct estimate is still checked)
        weights_only = vname in ("only_pytorch_model_bin", "safetensors_truncated", "safetensors_garbage", "safetensors_empty", "config_vocab_mismatch")
        tolerated = command == "cache" and weights_only
        case("verifier", f"{vname}/{command}", argv, files, "either" if tolerated else "error",
             names=lambda c, vname=vname: [c.p(f"v_{vname}"), f"v_{vname}"],
             check=(lambda c, out: None if re.search(r"total: [1-9][\d,]* tokens", out) else "no token estimate") if tolerated else None,
             marker=vname.startswith("auto_map"))


# ---------------------------------------------------------------------------------------- checkpoints

class Evil:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def good_ckpt(ctx: Ctx) -> dict:
    return torch.load(ctx.ckpt, weights_only=True)


def mutated(change):
    def make(ctx: Ctx, path: str) -> None:
        data = good_ckpt(ctx)
        change(data)
        torch.save(data, path)
    return make


def first_key(data: dict, part: str) -> str:
    return next(k for k in data["state_dict"] if part in k)


def ds_dir(latest: str | None, tag_files: dict | None = None):
    def make(ctx: Ctx, path: str) -> None:
        Path(path).mkdir()
        if latest is not None:
            write(Path(path) / "latest", latest)
            if latest and ".." not in latest:
                (Path(path) / latest).mkdir(exist_ok=True)
        for name, content in (tag_files or {}).items():
            write(Path(path) / name, content)
    return make


CKPT_VARIANTS = {
    "empty_file": lambda c, p: write(p, b""),
    "garbage": lambda c, p: write(p, bytes((i * 31 + 7) % 256 for i in range(2048))),
    "text": lambda c, p: write(p, "this is a text file, not a checkpoint\n"),
    "truncated_zip": lambda c, p: write(p, Path(c.ckpt).read_bytes()[:3000]),
    "malicious_pickle_raw": lambda c, p: write(p, pickle.dumps(Evil(str(c.marker)))),
    "malicious_pickle_torch": lambda c, p: torch.save({"taps": Evil(str(c.marker)), "state_dict": {}}, p),
    "empty_dict": lambda c, p: torch.save({}, p),
    "a_list": lambda c, p: torch.save([1, 2, 3], p),
    "a_tensor": lambda c, p: torch.save(torch.zeros(3), p),
    "taps_not_dict": mutated(lambda d: d.__setitem__("taps", [1])),
    "taps_no_drafter_config": mutated(lambda d: d["taps"].pop("drafter_config")),
    "taps_drafter_config_garbage": mutated(lambda d: d["taps"].__setitem__("drafter_config", {"hidden_size": "big"})),
    "taps_verifier_missing_keys": mutated(lambda d: d["taps"].__setitem__("verifier", {"path": "x"})),
    "state_dict_missing": mutated(lambda d: d.pop("state_dict")),
    "state_dict_empty": mutated(lambda d: d.__setitem__("state_dict", {})),
    "state_dict_non_tensor": mutated(lambda d: d["state_dict"].__setitem__(first_key(d, "fc"), [1.0, 2.0])),
    "state_dict_wrong_shape": mutated(lambda d: d["state_dict"].__setitem__(first_key(d, "q_proj"), torch.zeros(3, 5))),
    "state_dict_wrong_dtype_int": mutated(lambda d: d["state_dict"].__setitem__(first_key(d, "q_proj"),
                                                                              d["state_dict"][first_key(d, "q_proj")].to(torch.int64))),
    "state_dict_extra_key": mutated(lambda d: d["state_dict"].__setitem__("drafter.bogus.weight", torch.zeros(2))),
    "nan_weights": mutated(lambda d: d["state_dict"][first_key(d, "fc")].fill_(math.nan)),
    "inf_weights": mutated(lambda d: d["state_dict"][first_key(d, "q_proj")].fill_(math.inf)),
    "dir_without_latest": ds_dir(None, {"checkpoint/mp_rank_00_model_states.pt": b"x"}),
    "ds_latest_traversal": ds_dir("../../../etc"),
    "ds_latest_missing_tag": ds_dir("global_step7"),
    "ds_latest_empty": ds_dir(""),
    "ds_tag_garbage_files": ds_dir("checkpoint", {"checkpoint/mp_rank_00_model_states.pt": b"garbage",
                                                  "checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt": b"garbage"}),
    "ds_tag_malicious": lambda c, p: (ds_dir("checkpoint")(c, p),
                                      torch.save({"module": Evil(str(c.marker))}, Path(p) / "checkpoint" / "mp_rank_00_model_states.pt")),
    "plain_empty_dir": lambda c, p: Path(p).mkdir(),
    "missing": lambda c, p: None,
}
for cname, make in CKPT_VARIANTS.items():
    commands = ["eval", "export", "average"] + (["consolidate"] if cname.startswith(("ds_", "dir_", "plain_", "garbage", "missing")) else [])
    for command in commands:
        def files(ctx, make=make, cname=cname):
            make(ctx, ctx.p(f"{cname}.ckpt"))

        def argv(c, command=command, cname=cname):
            bad = c.p(f"{cname}.ckpt")
            return {"eval": ["eval", "--drafters", bad, "--verifier", c.verifier, "--benchmarks", f"gsm8k:{c.root / 'bench.jsonl'}",
                             "--prompts", "1", "--max-new-tokens", "4", "--output", c.p("out/report.json")],
                    "export": ["export", bad, "--out", c.p("export"), "--verifier", c.verifier],
                    "average": ["average", "--drafters", c.ckpt, bad, "--output", c.p("avg.ckpt")],
                    "consolidate": ["consolidate", bad, "--output", c.p("out.ckpt")]}[command]
        case("checkpoint", f"{cname}/{command}", argv, files, names=lambda c, cname=cname: [c.p(f"{cname}.ckpt"), f"{cname}.ckpt"],
             marker="malicious" in cname)


def exists_check(*names):
    def check(ctx: Ctx, out: str) -> str | None:
        missing = [n for n in names if not (ctx.d / n).exists()]
        return f"missing outputs {missing}" if missing else None
    return check


def loadable_ckpt(name):
    def check(ctx: Ctx, out: str) -> str | None:
        try:
            data = torch.load(ctx.d / name, weights_only=True)
            if not all(torch.isfinite(v).all() for v in data["state_dict"].values() if v.is_floating_point()):
                return "non-finite weights written"
        except Exception as err:  # noqa: BLE001
            return f"output not loadable: {err}"
        return None
    return check


case("checkpoint", "good/eval", lambda c: ["eval", "--drafters", c.ckpt, "--verifier", c.verifier, "--benchmarks", f"gsm8k:{c.root / 'bench.jsonl'}",
                                          "--prompts", "1", "--max-new-tokens", "4", "--output", c.p("r.json")], expect="ok",
     check=lambda c, out: None if list(c.d.glob("r*.json")) else "no report written")
case("checkpoint", "good/consolidate_a_file", lambda c: ["consolidate", c.ckpt, "--output", c.p("o.ckpt")], names=lambda c: [c.ckpt, "good.ckpt"])


# ------------------------------------------------------------------------------------------- eval options

def eval_argv(*extra, drafters=None, bench=None, output=None):
    def argv(c: Ctx) -> list[str]:
        return ["eval", "--drafters", *(drafters(c) if drafters else [c.ckpt]), "--verifier", c.verifier,
                "--benchmarks", bench(c) if bench else f"gsm8k:{c.root / 'bench.jsonl'}", "--prompts", "1", "--max-new-tokens", "4",
                "--output", output(c) if output else c.p("out/report.json"), *extra]
    return argv


def report_check(c: Ctx, out: str) -> str | None:
    files = list((c.d / "out").glob("*.json")) if (c.d / "out").is_dir() else []
    if not files:
        return "no report written"
    text = files[0].read_text()
    if "NaN" in text or "Infinity" in text:
        return "report holds NaN/Infinity"
    return None


for label, extra, opt in [("max_new_tokens_0", ["--max-new-tokens", "0"], "--max-new-tokens"), ("max_new_tokens_neg", ["--max-new-tokens", "-5"], "--max-new-tokens"),
                          ("depth_0", ["--depth", "0"], "--depth"), ("depth_1000", ["--depth", "1000"], "--depth"), ("depth_neg", ["--depth", "-1"], "--depth"),
                          ("temperature_nan", ["--temperatures", "nan"], "--temperatures"), ("temperature_neg", ["--temperatures", "-1"], "--temperatures"),
                          ("temperature_inf", ["--temperatures", "inf"], "--temperatures"), ("top_p_0", ["--top-p", "0"], "--top-p"),
                          ("top_p_2", ["--top-p", "2"], "--top-p"), ("top_p_nan", ["--top-p", "nan"], "--top-p"),
                          ("top_k_0", ["--top-k", "0"], "--top-k"), ("top_k_huge", ["--top-k", str(10**9)], "--top-k"),
                          ("total_tokens_0", ["--total-tokens", "0"], "--total-tokens"), ("total_tokens_1", ["--total-tokens", "1"], "--total-tokens"),
("prompts_0", ["--prompts", "0"], "--prompts"),
                          ("prompts_neg", ["--prompts", "-1"], "--prompts"),
                          ("strategy_bogus", ["--strategy", "bogus"], "--strategy"), ("weights_nan", ["--strategy", "average", "--weights", "nan", "nan"], "--weights"),
                          ("weights_negative", ["--strategy", "average", "--weights", "-1", "2"], "--weights"),
                          ("weights_count_mismatch", ["--strategy", "average", "--weights", "0.2", "0.3", "0.5"], "--weights"),
                          ("max_new_tokens_string", ["--max-new-tokens", "many"], "--max-new-tokens")]:
    drafters = (lambda c: [c.ckpt, c.ckpt2]) if "weights" in label else None
    case("eval", label, eval_argv(*extra, drafters=drafters), names=lambda c, opt=opt: [opt, opt.lstrip("-"), opt.lstrip("-").replace("-", "_")])
case("eval", "max_new_tokens_huge", eval_argv("--max-new-tokens", str(10**6)), expect="either", names=lambda c: ["--max-new-tokens", "max_new_tokens"],
     check=report_check)
case("eval", "seed_neg", eval_argv("--seed", "-1"), expect="either", names=lambda c: ["--seed", "seed"], check=report_check)
case("eval", "total_tokens_huge", eval_argv("--total-tokens", str(10**7)), expect="either", names=lambda c: ["--total-tokens", "total_tokens"],
     check=report_check)
case("eval", "top_k_1_ok", eval_argv("--top-k", "1"), expect="ok", check=report_check)
case("eval", "temperature_1_top_p_small_ok", eval_argv("--temperatures", "1", "--top-p", "0.01"), expect="ok", check=report_check)
case("eval", "output_is_directory", eval_argv(output=lambda c: (os.makedirs(c.p("outdir"), exist_ok=True), c.p("outdir"))[1]),
     names=lambda c: [c.p("outdir"), "outdir", "--output"])
case("eval", "output_parent_is_file", eval_argv(output=lambda c: (write(c.p("afile"), "x"), c.p("afile/report.json"))[1]),
     names=lambda c: [c.p("afile"), "afile", "--output"])
for label, content in [("empty", ""), ("garbage", b"\xff\xfe\x00garbage"), ("no_usable", jl({"question": "q"}, {"foo": 1})), ("array_of_null", "[null]")]:
    case("eval", f"benchmark_{label}", eval_argv(bench=lambda c, label=label: f"gsm8k:{c.p(f'bench_{label}.jsonl')}"),
         files=lambda c, label=label, content=content: write(c.p(f"bench_{label}.jsonl"), content), names=lambda c, label=label: [f"bench_{label}.jsonl"])
case("eval", "benchmark_missing_file", eval_argv(bench=lambda c: f"gsm8k:{c.p('nope.jsonl')}"), names=lambda c: ["nope.jsonl"])


def calibrated_report(c: Ctx, tree: dict) -> str:
    """The valid report with a hand-written `--tree auto` calibration choosing `tree`."""
    data = json.loads(Path(c.report).read_text())
    data["tree"] = tree
    data["tree_calibration"] = {"choice": {**tree, "expected_tau": 2.0}}
    write(c.p("calibrated.json"), json.dumps(data))
    return c.p("calibrated.json")


# eval --tree-from: the tree another report's calibration chose
for label, extra in {"uncalibrated": lambda c: [c.report], "missing": lambda c: [c.p("nope.json")], "directory": lambda c: [str(c.d)],
                     "garbage": lambda c: (write(c.p("g.json"), b"\xff\x00"), c.p("g.json"))[1],
                     "with_tree_auto": lambda c: [calibrated_report(c, {"total_tokens": 4, "depth": 1, "top_k": 2}), "--tree", "auto"],
                     "with_depth": lambda c: [calibrated_report(c, {"total_tokens": 4, "depth": 1, "top_k": 2}), "--depth", "2"],
                     "depth_over_total": lambda c: [calibrated_report(c, {"total_tokens": 3, "depth": 7, "top_k": 2})],
                     "zero_tokens": lambda c: [calibrated_report(c, {"total_tokens": 0, "depth": 1, "top_k": 2})]}.items():
    case("eval", f"tree_from_{label}", lambda c, extra=extra: eval_argv("--tree-from", *([extra(c)] if isinstance(extra(c), str) else extra(c)))(c),
         names=lambda c: ["--tree-from", "tree_from", "tree", "total_tokens", "--total-tokens", "depth", "--depth"])
case("eval", "tree_from_ok", lambda c: eval_argv("--tree-from", calibrated_report(c, {"total_tokens": 4, "depth": 1, "top_k": 2}))(c),
     expect="ok", check=report_check)
case("eval", "benchmark_directory", eval_argv(bench=lambda c: (os.makedirs(c.p("bdir.jsonl"), exist_ok=True), f"gsm8k:{c.p('bdir.jsonl')}")[1]),
     names=lambda c: ["bdir.jsonl"])
case("eval", "benchmark_unknown_name", eval_argv(bench=lambda c: "nosuchbench"), names=lambda c: ["nosuchbench"])
case("eval", "benchmark_unknown_name_with_path", eval_argv(bench=lambda c: f"nosuch:{c.root / 'bench.jsonl'}"), names=lambda c: ["nosuch"])
case("eval", "drafter_missing", eval_argv(drafters=lambda c: [c.p("none.ckpt")]), names=lambda c: ["none.ckpt"])


# ------------------------------------------------------------------------------------------------ export

def export_argv(*extra, out=None, ckpts=None):
    return lambda c: ["export", *(ckpts(c) if ckpts else [c.ckpt]), "--out", out(c) if out else c.p("exp"), "--verifier", c.verifier, *extra]


def sentinel_kept(c: Ctx, out: str) -> str | None:
    return None if (c.d / "precious" / "keep.txt").exists() else "deleted a non-export directory"


def sentinel_files(c: Ctx) -> None:
    write(c.p("precious/keep.txt"), "do not delete")


case("export", "good_ok", export_argv("--dtype", "float32"), expect="ok", check=exists_check("exp/config.json", "exp/model.safetensors"))
case("export", "vllm_no_embeddings_ok", export_argv("--format", "vllm", "--no-embeddings"), expect="ok", check=exists_check("exp/config.json"))
case("export", "out_is_file", export_argv(out=lambda c: (write(c.p("f.txt"), "x"), c.p("f.txt"))[1]), names=lambda c: [c.p("f.txt"), "f.txt"])
case("export", "out_parent_is_file", export_argv(out=lambda c: (write(c.p("f2.txt"), "x"), c.p("f2.txt/exp"))[1]), names=lambda c: ["f2.txt"])
case("export", "non_export_dir_overwrite", export_argv("--overwrite", out=lambda c: c.p("precious")), sentinel_files, expect="error",
     names=lambda c: [c.p("precious"), "precious"], check=sentinel_kept)
case("export", "nonempty_dir_no_overwrite", export_argv(out=lambda c: c.p("precious")), sentinel_files, names=lambda c: [c.p("precious"), "precious"],
     check=sentinel_kept)
case("export", "symlinked_out", export_argv(out=lambda c: c.p("link")), lambda c: (os.makedirs(c.p("real")), os.symlink(c.p("real"), c.p("link"))),
     expect="either", names=lambda c: [c.p("link"), "link"], check=lambda c, o: None if (c.d / "real" / "config.json").exists() else "nothing in link target")
case("export", "symlinked_out_dangling", export_argv(out=lambda c: c.p("dlink")), lambda c: os.symlink(c.p("nowhere"), c.p("dlink")),
     expect="either", names=lambda c: [c.p("dlink"), "dlink"], check=lambda c, o: None if (c.d / "dlink" / "config.json").exists() else "no export")
case("export", "read_only_parent_root", export_argv(out=lambda c: c.p("ro/exp")), lambda c: (os.makedirs(c.p("ro")), os.chmod(c.p("ro"), 0o555)),
     expect="either", names=lambda c: ["ro"], check=exists_check("ro/exp/config.json"))
case("export", "out_equals_checkpoint", export_argv("--overwrite", out=lambda c: c.ckpt), names=lambda c: [c.ckpt, "good.ckpt"],
     check=lambda c, o: None if Path(c.ckpt).is_file() else "checkpoint destroyed")
case("export", "out_empty_string", export_argv(out=lambda c: ""), names=lambda c: ["--out", "''"])
case("export", "bad_format", export_argv("--format", "onnx"), names=lambda c: ["--format"])
case("export", "bad_dtype", export_argv("--dtype", "int4"), names=lambda c: ["--dtype"])
case("export", "eval_report_missing", export_argv("--eval-report", "/nonexistent/r.json"), names=lambda c: ["/nonexistent/r.json"])
case("export", "eval_report_garbage", lambda c: ["export", c.ckpt, "--out", c.p("exp"), "--verifier", c.verifier, "--eval-report", c.p("bad_report.json")],
     lambda c: write(c.p("bad_report.json"), "{nope"),
     names=lambda c: ["bad_report.json"])
# depth 0 (one drafted level) is a valid EAGLE-2 depth for a bundle
case("export", "bundle_depth_0", export_argv("--depth", "0", ckpts=lambda c: [c.ckpt, c.ckpt2]), expect="either", names=lambda c: ["--depth", "depth"],
     check=exists_check("exp/bundle.json"))
for label, extra, opt in [("domains_mismatch", ["--domains", "math"], "--domains"), ("depth_neg", ["--depth", "-1"], "--depth"),
                          ("total_tokens_neg", ["--total-tokens", "-1"], "--total-tokens"), ("top_k_0", ["--top-k", "0"], "--top-k"),
                          ("bundle_strategy_bogus", ["--bundle-strategy", "nope"], "--bundle-strategy")]:
    case("export", f"bundle_{label}", export_argv(*extra, ckpts=lambda c: [c.ckpt, c.ckpt2]), names=lambda c, opt=opt: [opt, opt.lstrip("-").replace("-", "_")])
case("export", "bundle_ok", export_argv(ckpts=lambda c: [c.ckpt, c.ckpt2]), expect="ok", check=exists_check("exp/bundle.json"))
case("export", "single_with_bundle_option", export_argv("--depth", "3"), names=lambda c: ["--depth"])
case("export", "verifier_missing", lambda c: ["export", c.ckpt, "--out", c.p("exp"), "--verifier", c.p("novdir")], names=lambda c: ["novdir"])


# ----------------------------------------------------------------------------------------------- average

def avg_argv(*weights, drafters=None, output=None):
    return lambda c: ["average", "--drafters", *(drafters(c) if drafters else [c.ckpt, c.ckpt2]),
                      *(["--weights", *weights] if weights else []), "--output", output(c) if output else c.p("avg.ckpt")]


case("average", "good_ok", avg_argv(), expect="ok", check=loadable_ckpt("avg.ckpt"))
case("average", "weights_ok", avg_argv("0.25", "0.75"), expect="ok", check=loadable_ckpt("avg.ckpt"))
for label, weights in [("nan", ("nan", "nan")), ("inf", ("inf", "0")), ("negative", ("-0.5", "1.5")), ("sum_not_one", ("0.2", "0.2")),
                       ("all_zero", ("0", "0")), ("count_mismatch_more", ("0.3", "0.3", "0.4")), ("count_mismatch_less", ("1.0",)),
                       ("not_a_number", ("half", "half"))]:
    case("average", f"weights_{label}", avg_argv(*weights), names=lambda c: ["--weights", "weights"])
case("average", "output_equals_input", avg_argv(drafters=lambda c: [c.p("a.ckpt"), c.ckpt2], output=lambda c: c.p("a.ckpt")),
     lambda c: shutil.copy(c.ckpt, c.p("a.ckpt")), names=lambda c: ["--output", "a.ckpt"],
     check=lambda c, o: None if torch.equal(*(torch.load(p, weights_only=True)["state_dict"][first_key(torch.load(c.ckpt, weights_only=True), "fc")]
                                              for p in (c.p("a.ckpt"), c.ckpt))) else "input overwritten")
case("average", "output_is_directory", avg_argv(output=lambda c: (os.makedirs(c.p("od"), exist_ok=True), c.p("od"))[1]), names=lambda c: ["od", "--output"])
case("average", "output_parent_missing", avg_argv(output=lambda c: c.p("no/such/dir/avg.ckpt")), expect="either",
     names=lambda c: ["no/such/dir", "--output"], check=loadable_ckpt("no/such/dir/avg.ckpt"))
case("average", "one_drafter", avg_argv(drafters=lambda c: [c.ckpt]), names=lambda c: ["--drafters", "drafters", "two"])
case("average", "same_drafter_twice", avg_argv(drafters=lambda c: [c.ckpt, c.ckpt]), expect="either", names=lambda c: ["good.ckpt"],
     check=loadable_ckpt("avg.ckpt"))
case("average", "drafter_missing", avg_argv(drafters=lambda c: [c.ckpt, c.p("ghost.ckpt")]), names=lambda c: ["ghost.ckpt"])
case("average", "other_verifier_drafter", avg_argv(drafters=lambda c: [c.ckpt, c.p("stranger.ckpt")]),
     lambda c: mutated(lambda d: d["taps"]["verifier"].__setitem__("weights", "0" * 16))(c, c.p("stranger.ckpt")),
     names=lambda c: ["stranger.ckpt"])


# ------------------------------------------------------------------------------------------------ report

def report_case(name: str, content, expect: str = "error", check=None, as_dir: bool = False) -> None:
    def files(ctx: Ctx) -> None:
        body = content(ctx) if callable(content) else content
        if body is None:
            return
        target = ctx.d / "reports" / f"{name}.json" if as_dir else ctx.d / f"{name}.json"
        write(target, body if isinstance(body, (str, bytes)) else json.dumps(body))

    def argv(c: Ctx) -> list[str]:
        return ["report", c.p("reports") if as_dir else c.p(f"{name}.json"), "--out", c.p("out")]
    case("report", name, argv, files, expect, names=lambda c: [f"{name}.json", c.p("reports") if as_dir else c.p(f"{name}.json"), "reports"],
         check=check)


def base_report(ctx: Ctx) -> dict:
    return json.loads(Path(ctx.report).read_text())


def rep(change):
    def make(ctx: Ctx) -> dict:
        data = base_report(ctx)
        change(data)
        return data
    return make


def bench0(d: dict) -> dict:
    return next(iter(d["benchmarks"].values()))


report_case("good_ok", rep(lambda d: None), "ok", check=exists_check("out/report.md"))
report_case("empty_file", "")
report_case("garbage", b"\x00\xffgarbage")
report_case("a_list", [])
report_case("a_string", '"report"')
report_case("empty_object", {})
report_case("missing_benchmarks", rep(lambda d: d.pop("benchmarks")))
report_case("benchmarks_list", rep(lambda d: d.__setitem__("benchmarks", [1, 2])))
report_case("benchmarks_empty", rep(lambda d: d.__setitem__("benchmarks", {})))
report_case("missing_temperature", rep(lambda d: d.pop("temperature")))
report_case("temperature_string", rep(lambda d: d.__setitem__("temperature", "hot")))
report_case("tau_string", rep(lambda d: bench0(d).__setitem__("acceptance_length", "high")))
report_case("tau_nan", lambda c: json.dumps(rep(lambda d: bench0(d).__setitem__("acceptance_length", float("nan")))(c)))
report_case("tau_missing", rep(lambda d: bench0(d).pop("acceptance_length")))
report_case("accept_rate_wrong_type", rep(lambda d: bench0(d).__setitem__("accept_rate_by_depth", "a lot")))
report_case("accept_rate_nested_lists", rep(lambda d: bench0(d).__setitem__("accept_rate_by_depth", [[1], [2]])))
report_case("drafters_not_list", rep(lambda d: d.__setitem__("drafters", 5)))
report_case("strategy_number", rep(lambda d: d.__setitem__("strategy", 7)))
report_case("deep_nesting", lambda c: "[" * 100_000 + "]" * 100_000)
report_case("huge_numbers", rep(lambda d: bench0(d).__setitem__("acceptance_length", 1e308)), "either",
            check=exists_check("out/report.md"))
report_case("empty_dir", lambda c: os.makedirs(c.d / "reports") and None, as_dir=True)
report_case("dir_non_json_only", lambda c: write(c.d / "reports" / "notes.txt", "hi") and None, as_dir=True)
report_case("dir_one_bad_one_good", lambda c: (write(c.d / "reports" / "bad.json", "{x"), base_report(c))[1], as_dir=True)
report_case("missing_file", None)
case("report", "out_is_file", lambda c: ["report", c.report, "--out", c.p("f.txt")], lambda c: write(c.p("f.txt"), "x"),
     names=lambda c: [c.p("f.txt"), "f.txt", "--out"])


# ------------------------------------------------------------------------------------------------ study

def study_files(ctx: Ctx) -> None:
    """A recipe, a fit config and two benchmark files a valid study can name."""
    write(ctx.d / "r.yaml", recipe_text(ctx.good_data, count=3))
    write(ctx.d / "fit.yaml", f"model:\n  class_path: taps_train.training.Eagle2Module\n  init_args: {{verifier: {ctx.verifier}}}\n"
          "data:\n  class_path: taps_train.data.datamodule.DrafterDataModule\n  init_args: {recipe: r.yaml}\n")


def study_data(ctx: Ctx) -> dict:
    bench = str(ctx.root / "bench.jsonl")
    return {"name": "s", "verifier": ctx.verifier, "out_root": str(ctx.d / "out"), "backbones": {"eagle2": str(ctx.d / "fit.yaml")},
            "domains": {"a": {"recipe": str(ctx.d / "r.yaml"), "benchmarks": [f"gsm8k:{bench}"]},
                        "b": {"recipe": str(ctx.d / "r.yaml"), "benchmarks": [f"svamp:{bench}"]}},
            "max_steps": 2, "prompts": 1, "max_new_tokens": 4}


def study_case(name: str, content, expect: str = "error", extra: tuple[str, ...] = ("--dry-run",), field: str | None = None) -> None:
    """`content`: the study file's text or bytes, a change to the valid study's data, or None (no file)."""
    def files(ctx: Ctx) -> None:
        study_files(ctx)
        if content is None:
            return
        if callable(content):
            data = study_data(ctx)
            content(data, ctx)
            write(ctx.d / "s.yaml", json.dumps(data))
        else:
            write(ctx.d / "s.yaml", content)
    case("study", name, lambda c: ["study", "--config", c.p("s.yaml"), *extra], files, expect,
         names=lambda c: [c.p("s.yaml"), "s.yaml", *([field] if field else [])])


def setting_study(key, value):
    return lambda data, ctx: data.__setitem__(key, value(ctx) if callable(value) else value)


study_case("good_dry_run", lambda data, ctx: None, "ok")
study_case("missing_file", None)
study_case("empty_file", "")
study_case("garbage", b"\x00\xff\xfe garbage")
study_case("a_list", "- a\n- b\n")
study_case("a_string", "just words\n")
study_case("invalid_yaml", "name: [unclosed\n")
study_case("passwd_like", "root:x:0:0:root:/root:/bin/bash\n")
study_case("no_name", lambda data, ctx: data.pop("name"))
study_case("no_domains", lambda data, ctx: data.pop("domains"))
study_case("domains_list", setting_study("domains", [1, 2]))
study_case("one_domain", lambda data, ctx: data["domains"].pop("b"))
study_case("domain_without_recipe", lambda data, ctx: data["domains"]["a"].pop("recipe"))
study_case("benchmarks_string", lambda data, ctx: data["domains"]["a"].__setitem__("benchmarks", "gsm8k"), "either")
study_case("benchmarks_empty", lambda data, ctx: data["domains"]["a"].__setitem__("benchmarks", []))
study_case("unknown_benchmark", lambda data, ctx: data["domains"]["a"].__setitem__("benchmarks", ["gsm9k"]))
study_case("benchmark_file_missing", lambda data, ctx: data["domains"]["a"].__setitem__("benchmarks", ["gsm8k:/no/such.jsonl"]))
study_case("recipe_missing", lambda data, ctx: data["domains"]["a"].__setitem__("recipe", "/no/such/recipe.yaml"))
study_case("backbone_missing", setting_study("backbones", {"eagle2": "/no/such/fit.yaml"}))
study_case("backbone_a_list", lambda data, ctx: (write(ctx.d / "fit.yaml", "- x\n"), None)[1])
study_case("backbone_binary", lambda data, ctx: (write(ctx.d / "fit.yaml", b"\x00\xff"), None)[1])
study_case("backbones_empty", setting_study("backbones", {}))
study_case("strategy_unknown", setting_study("strategies", ["vote"]))
study_case("strategy_single", setting_study("strategies", ["single"]))
study_case("lambda_above_one", setting_study("lambdas", [1.5]))
study_case("lambdas_three_domains", lambda data, ctx: (data["domains"].__setitem__("c", dict(data["domains"]["a"])),
                                                       data.__setitem__("lambdas", [0.5])))
study_case("max_steps_zero", setting_study("max_steps", 0))
study_case("max_steps_negative", setting_study("max_steps", -3))
study_case("max_steps_string", setting_study("max_steps", "many"))
study_case("prompts_zero", setting_study("prompts", 0))
study_case("temperature_negative", setting_study("temperatures", [-1.0]))
study_case("temperatures_empty", setting_study("temperatures", []))
study_case("tree_depth_string", setting_study("tree", {"depth": "deep"}))
study_case("name_with_slash", setting_study("name", "../escape"))
study_case("name_empty", setting_study("name", ""))
study_case("mixture_named_like_domain", setting_study("mixtures", {"a": "x.yaml"}))
study_case("unknown_key", setting_study("max_step", 3))
study_case("out_root_under_a_file", setting_study("out_root", lambda ctx: str(ctx.root / "bench.jsonl")), extra=(), field="out_root")
study_case("trees_a_string", setting_study("trees", "auto"), field="trees")
study_case("trees_empty", setting_study("trees", []), field="trees")
study_case("trees_twice", setting_study("trees", ["auto", "auto"]), field="trees")
study_case("trees_unknown", setting_study("trees", ["paper"]), field="trees")
study_case("trees_a_mapping", setting_study("trees", {"fixed": 1}), field="trees")
study_case("trees_auto_only_ok", setting_study("trees", ["auto"]), "ok")
study_case("baseline_true", setting_study("baseline", True), "either", field="baseline")
study_case("baseline_unknown_tree", setting_study("baseline", ["paper"]), field="baseline")
study_case("baseline_none_ok", setting_study("baseline", []), "ok")
study_case("report_dir_a_file", setting_study("report_dir", lambda ctx: str(ctx.root / "bench.jsonl")), field="report_dir")
study_case("report_dir_proc", setting_study("report_dir", "/proc/taps-report"), field="report_dir")
study_case("report_dir_a_list", setting_study("report_dir", ["a", "b"]), field="report_dir")
study_case("compare_with_missing", setting_study("compare_with", "/no/such/report.md"), field="compare_with")
study_case("compare_with_a_folder", setting_study("compare_with", lambda ctx: str(ctx.root)), field="compare_with")
study_case("compare_with_dev_zero", setting_study("compare_with", "/dev/zero"), field="compare_with")
study_case("compare_with_binary", lambda data, ctx: (write(ctx.d / "other.md", b"\x00\xff" * 64),
                                                     data.__setitem__("compare_with", str(ctx.d / "other.md"))), field="compare_with")
study_case("compare_with_no_claims", lambda data, ctx: (write(ctx.d / "other.md", "# a report\n| a | b |\n"),
                                                        data.__setitem__("compare_with", str(ctx.d / "other.md"))), field="compare_with")
study_case("compare_with_a_list", setting_study("compare_with", ["a.md"]), field="compare_with")
case("study", "override_bad_type", lambda c: ["study", "--config", c.p("s.yaml"), "--prompts", "many", "--dry-run"],
     lambda c: (study_files(c), write(c.d / "s.yaml", json.dumps(study_data(c)))), names=lambda c: [c.p("s.yaml"), "prompts"])


# ------------------------------------------------------------------------------------------- round 3 (issue 24)
# The environment, study settings and folders, fit options and configs, verifier directories and prompts, and
# where results go: each class fixed at its root; these cases were written against the fixed code's contracts.

def _home_file(c: Ctx) -> str:
    write(c.d / "home-file", "x")
    return str(c.d / "home-file")


HOMES = {"a_file": _home_file, "under_a_file": lambda c: _home_file(c) + "/sub", "proc": lambda c: "/proc/taps-home",
         "dev_null": lambda c: "/dev/null/taps-home", "sys": lambda c: "/sys/taps-home"}
HOME_COMMANDS = {
    "report": lambda c: ["report", c.report, "--out", c.p("r")],
    "eval": eval_argv(),
    "cache": lambda c: ["cache", "--dry-run", "--no-time", "--recipe", c.p("r.yaml"), "--verifier", c.verifier],
    "verifier_info": lambda c: ["verifier", "info", "--verifier", c.verifier],
    "export": lambda c: ["export", c.ckpt, "--out", c.p("exp"), "--no-embeddings"],
}
for home_name, home in HOMES.items():
    for command_name, command in HOME_COMMANDS.items():
        case("env", f"TAPS_HOME_{home_name}/{command_name}", command, lambda c: write(c.d / "r.yaml", recipe_text(c.good_data, count=3)),
             names=lambda c: ["TAPS_HOME"], env=lambda c, home=home: {"TAPS_HOME": home(c)})
for label, cache_dir in {"a_file": lambda c: _home_file(c), "under_a_file": lambda c: _home_file(c) + "/x", "proc": lambda c: "/proc/x/cache",
                         "dev_null": lambda c: "/dev/null/cache"}.items():
    case("env", f"cache_dir_{label}", lambda c, d=cache_dir: ["cache", "--dry-run", "--no-time", "--recipe", c.p("r.yaml"), "--verifier", c.verifier,
                                                               "--cache-dir", d(c)],
         lambda c: write(c.d / "r.yaml", recipe_text(c.good_data, count=3)), names=lambda c: ["--cache-dir"])

# study --dry-run checks what fit and eval would refuse, with their rules
for key, value in {"tree_total_tokens_0": {"total_tokens": 0}, "tree_depth_negative": {"depth": -1}, "tree_top_k_0": {"top_k": 0},
                   "tree_depth_over_total": {"total_tokens": 4, "depth": 9}, "tree_total_string": {"total_tokens": "many"}}.items():
    study_case(key, setting_study("tree", value), field="tree")
for label, temps in {"nan": [".nan"], "inf": [".inf"], "minus_inf": ["-.inf"], "string": ["hot"], "mixed": [0.0, ".nan"]}.items():
    study_case(f"temperature_{label}", f"name: s\ntemperatures: [{', '.join(map(str, temps))}]\n", field="temperatures")
study_case("benchmark_heldout_with_a_path", lambda data, ctx: data["domains"]["a"].__setitem__("benchmarks", ["math_heldout:/etc/hosts"]))
study_case("benchmark_chat_heldout_not_a_recipe", lambda data, ctx: data["domains"]["a"].__setitem__("benchmarks", [f"chat_heldout:{ctx.good_data}"]))
study_case("benchmark_arith_with_a_path", lambda data, ctx: data["domains"]["a"].__setitem__("benchmarks", ["arith_offline:/tmp/x"]))
study_case("benchmark_number", lambda data, ctx: data["domains"]["a"].__setitem__("benchmarks", [7]))
study_case("verifier_missing", setting_study("verifier", "/no/such/verifier"), field="verifier")
study_case("verifier_a_file", setting_study("verifier", lambda ctx: ctx.good_data), field="verifier")
study_case("verifier_gguf_missing", setting_study("verifier", "/no/such/model.gguf"), field="verifier")
study_case("verifier_empty", setting_study("verifier", ""), field="verifier")
study_case("seed_negative", setting_study("seed", -1), field="seed")
study_case("seed_string", setting_study("seed", "lucky"), field="seed")
study_case("prompts_negative", setting_study("prompts", -1), field="prompts")
study_case("max_new_tokens_zero", setting_study("max_new_tokens", 0), field="max_new_tokens")
study_case("lambda_nan", lambda data, ctx: data.__setitem__("lambdas", [float("nan")]))
study_case("duplicate_key", lambda data, ctx: None)  # replaced below: text with a key written twice
CASES.pop()
case("study", "duplicate_key", lambda c: ["study", "--config", c.p("s.yaml"), "--dry-run"],
     lambda c: (study_files(c), write(c.d / "s.yaml", json.dumps(study_data(c))[:-1] + ', "prompts": 3}')), names=lambda c: [c.p("s.yaml")])
case("study", "alias_bomb", lambda c: ["study", "--config", c.p("s.yaml"), "--dry-run"],
     lambda c: (study_files(c), write(c.d / "s.yaml", BOMB)), names=lambda c: [c.p("s.yaml")])
case("study", "date_value", lambda c: ["study", "--config", c.p("s.yaml"), "--dry-run"],
     lambda c: (study_files(c), write(c.d / "s.yaml", "name: 2024-01-01\n")), names=lambda c: [c.p("s.yaml")])
BACKBONES = {
    "trainer_list": "trainer: [1, 2]\n", "trainer_string": "trainer: fast\n", "model_init_args_list": None, "callback_string": "trainer: {callbacks: foo}\n",
    "callbacks_of_strings": "trainer: {callbacks: [a, b]}\n", "logger_init_args_string": "trainer: {logger: {class_path: x, init_args: s}}\n",
    "date_value": "trainer: {max_epochs: 2024-01-01}\n", "alias_bomb": None, "duplicate_key": "trainer: {max_steps: 1}\ntrainer: {max_steps: 2}\n",
    "not_utf8": None, "data_class_path_number": "data: {class_path: 3}\n",
}


def _backbone(label: str, extra: str | None):
    def change(data: dict, ctx: Ctx) -> None:
        path = ctx.d / "bad_fit.yaml"
        base = (ctx.d / "fit.yaml").read_text()
        if label == "model_init_args_list":
            write(path, base.replace("init_args: {verifier:", "init_args: [").replace("}\ndata", "]\ndata", 1))
        elif label == "alias_bomb":
            write(path, BOMB)
        elif label == "not_utf8":
            write(path, base.encode() + "# caf\xe9\n".encode("latin-1"))
        else:
            write(path, extra + base)
        data["backbones"] = {"eagle2": str(path)}
    return change


for label, extra in BACKBONES.items():
    study_case(f"backbone_{label}", _backbone(label, extra), field="backbones")
case("study", "logs_is_a_file", lambda c: ["study", "--config", c.p("s.yaml")],
     lambda c: (study_files(c), write(c.d / "s.yaml", json.dumps(study_data(c))), write(c.d / "out" / "s" / "logs", "x")),
     names=lambda c: ["logs"])
case("study", "cell_record_is_a_directory", lambda c: ["study", "--config", c.p("s.yaml"), "--dry-run"],
     lambda c: (study_files(c), write(c.d / "s.yaml", json.dumps(study_data(c))), (c.d / "out" / "s" / "cells" / "fit_eagle2_a.json").mkdir(parents=True)),
     names=lambda c: ["fit_eagle2_a.json"])
case("study", "recipe_not_utf8", lambda c: ["study", "--config", c.p("s.yaml"), "--dry-run"],
     lambda c: (study_files(c), write(c.d / "r.yaml", b"name: caf\xe9\nsources: []\n"), write(c.d / "s.yaml", json.dumps(study_data(c)))),
     names=lambda c: [c.p("r.yaml")])


# fit: every option out of range, hand-edited configs and foreign classes, before any training step
def fit_config(c: Ctx, model: dict | None = None, data: dict | None = None, trainer: dict | None = None, top: dict | None = None,
               module: str = "taps_train.training.Eagle2Module") -> dict:
    write(c.d / "r.yaml", recipe_text(c.good_data, count=6))
    return {"seed_everything": 0,
            "trainer": {"accelerator": "cpu", "max_steps": 1, "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                        "num_sanity_val_steps": 0, "limit_val_batches": 0, "default_root_dir": c.p("run"), **(trainer or {})},
            "model": {"class_path": module, "init_args": {"verifier": c.verifier, **(model or {})}},
            "data": {"class_path": "taps_train.data.datamodule.DrafterDataModule",
                     "init_args": {"recipe": c.p("r.yaml"), "batch_size": 2, "cache_dir": c.p("cache"), **(data or {})}}, **(top or {})}


def fit_case(name: str, make, expect: str = "error", field: str | None = None, marker: bool = False, extra: tuple[str, ...] = ()) -> None:
    """`make(ctx)` returns the config (a dict, written as YAML) or its text."""
    def files(c: Ctx) -> None:
        config = make(c)
        write(c.d / "fit.yaml", config if isinstance(config, (str, bytes)) else yaml_dump(config))
    case("fit", name, lambda c: ["fit", "--config", c.p("fit.yaml"), *extra], files, expect,
         names=lambda c: [c.p("fit.yaml"), *([field] if field else [])], marker=marker)


def yaml_dump(config: dict) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False)


fit_case("good", lambda c: fit_config(c), "ok")
for key, values in {"batch_size": [0, -1, "two", 1.5], "max_tokens_per_batch": [0, -5, 1, 100], "val_samples_per_source": [-1, "all"],
                    "num_workers": [-1], "seed": [-2]}.items():
    for value in values:
        fit_case(f"data.{key}={value}", lambda c, k=key, v=value: fit_config(c, data={k: v}), field=f"data")
for key, values in {"lr": [".nan", "-1.0e-3", "0", ".inf", "fast"], "warmup_steps": [-1], "weight_decay": [-0.1, ".nan"], "min_lr_ratio": [2.0, -1],
                    "betas": ["[0.9, 1.5]", "[0.9]", "[-0.1, 0.9]"], "topk": [0], "feature_noise": ["-.inf"], "prob_weight": [-1],
                    "accuracy_topk": [0], "align_steps": [0], "schedule_steps": [0]}.items():
    for value in values:
        fit_case(f"model.{key}={value}", lambda c, k=key, v=value: yaml_dump(fit_config(c)).replace(
            f"verifier: {c.verifier}", f"verifier: {c.verifier}\n    {k}: {v}"), field="model")
for key, value in {"max_steps": -5, "max_epochs": -3, "log_every_n_steps": 0, "accumulate_grad_batches": 0, "gradient_clip_val": -1.0,
                   "limit_val_batches": -1, "limit_train_batches": -2, "min_steps": -1}.items():
    fit_case(f"trainer.{key}={value}", lambda c, k=key, v=value: fit_config(c, trainer={k: v}), field="trainer")
fit_case("trainer.gradient_clip_val=nan", lambda c: yaml_dump(fit_config(c)).replace("max_steps: 1", "max_steps: 1\n  gradient_clip_val: .nan"),
         field="trainer")
fit_case("data.cache_dir_a_file", lambda c: (write(c.d / "cache-file", "x"), fit_config(c, data={"cache_dir": c.p("cache-file")}))[1], field="data.cache_dir")
fit_case("data.cache_dir_proc", lambda c: fit_config(c, data={"cache_dir": "/proc/taps-cache"}), field="data.cache_dir")
fit_case("eagle3_draft_vocab_over_vocabulary", lambda c: fit_config(c, model={"draft_vocab_size": 10_000_000},
                                                                    module="taps_train.training.Eagle3Module"), field="draft_vocab_size")
for target in ("model", "data"):
    for callable_path in ("os.system", "subprocess.Popen", "builtins.eval", "builtins.exec", "shutil.rmtree"):
        fit_case(f"{target}_class_path_{callable_path}", lambda c, t=target, p=callable_path: {
            **fit_config(c), t: {"class_path": p, "init_args": {"command": f"touch {c.marker}", "args": ["touch", str(c.marker)]}}},
            field=target, marker=True)
for section, path in (("callbacks", "os.system"), ("callbacks", "subprocess.Popen"), ("logger", "os.system"), ("plugins", "subprocess.Popen"),
                      ("profiler", "os.system")):
    fit_case(f"trainer.{section}_{path}", lambda c, s=section, p=path: fit_config(c, trainer={s: [{"class_path": p, "init_args": {
        "command": f"touch {c.marker}"}}] if s != "profiler" else {"class_path": p, "init_args": {"command": f"touch {c.marker}"}}}),
        field="trainer", marker=True)
fit_case("unknown_model_key", lambda c: fit_config(c, model={"bogus_option": 1}), field="model")
fit_case("seed_everything_string", lambda c: fit_config(c, top={"seed_everything": "lucky"}), field="seed_everything")
fit_case("python_tag_in_init_args", lambda c: yaml_dump(fit_config(c)).replace(f"verifier: {c.verifier}",
         f"verifier: !!python/object/apply:os.system ['touch {c.marker}']"), marker=True)
fit_case("trainer_a_list", lambda c: {**fit_config(c), "trainer": [1, 2]}, field="trainer")
fit_case("model_init_args_a_list", lambda c: {**fit_config(c), "model": {"class_path": "taps_train.training.Eagle2Module", "init_args": [1]}},
         field="model")
fit_case("callbacks_a_string", lambda c: fit_config(c, trainer={"callbacks": "foo"}), field="trainer.callbacks")
fit_case("logger_init_args_a_string", lambda c: fit_config(c, trainer={"logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                                                                  "init_args": "x"}}), field="trainer.logger")
fit_case("date_value", lambda c: yaml_dump(fit_config(c)).replace("max_steps: 1", "max_steps: 2024-01-01"), field="max_steps")
fit_case("alias_bomb", lambda c: BOMB)
fit_case("duplicate_key", lambda c: yaml_dump(fit_config(c)) + "seed_everything: 3\n")
fit_case("not_utf8", lambda c: yaml_dump(fit_config(c)).encode() + "# caf\xe9\n".encode("latin-1"))
fit_case("a_list_not_a_config", lambda c: "- 1\n- 2\n")


def _eagle3_checkpoint(c: Ctx) -> str:
    from taps_train.training import Eagle3Module

    module = Eagle3Module(verifier=c.verifier, draft_vocab_size=0.5)
    state = {f"drafter.{k}": v for k, v in module.drafter.state_dict().items() if k not in module.drafter.frozen_parameter_names()}
    torch.save({"state_dict": state, "taps": {"drafter_config": module.drafter.config.to_dict(), "verifier": module.verifier_fingerprint},
                "pytorch-lightning_version": "2.6.0", "epoch": 0, "global_step": 1, "optimizer_states": [], "lr_schedulers": []},
               c.d / "e3.ckpt")
    return str(c.d / "e3.ckpt")


fit_case("ckpt_path_of_another_backbone", lambda c: (_eagle3_checkpoint(c), fit_config(c))[1], extra=(), field="e3.ckpt")
CASES[-1].argv = lambda c: ["fit", "--config", c.p("fit.yaml"), "--ckpt_path", c.p("e3.ckpt")]
fit_case("init_from_another_backbone", lambda c: fit_config(c, model={"init_from": _eagle3_checkpoint(c)}), field="e3.ckpt")
fit_case("hass_checkpoint_into_eagle2", lambda c: fit_config(c, model={"init_from": c.ckpt}, module="taps_train.training.HassModule"),
         field="good.ckpt")


# verifier directories and prompts
def verifier_copy(c: Ctx, change) -> str:
    target = c.d / "v"
    shutil.copytree(c.verifier_dir, target)
    change(target)
    return str(target)


def _bert(target: Path) -> None:
    from transformers import BertConfig, BertModel

    shutil.rmtree(target)
    BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).save_pretrained(target)


def _index(weight_map) -> Callable[[Path], None]:
    return lambda target: write(target / "model.safetensors.index.json", json.dumps({"weight_map": weight_map}))


def _template(template: str | None) -> Callable[[Path], None]:
    def change(target: Path) -> None:
        (target / "chat_template.jinja").unlink(missing_ok=True)
        edit_json(target / "tokenizer_config.json", lambda d: d.pop("chat_template", None))
        if template is not None:
            write(target / "chat_template.jinja", template)
    return change


VERIFIER_DIRS = {
    "bert_model": _bert,
    "index_parent_escape": _index({"lm_head.weight": "../../etc/passwd"}),
    "index_absolute": _index({"lm_head.weight": "/etc/passwd"}),
    "index_not_a_map": _index(["a", "b"]),
    "index_value_number": _index({"lm_head.weight": 3}),
    "no_chat_template": _template(None),
    "template_syntax_error": _template("{% for m in messages %}{{ m.content "),
    "template_raises": _template("{{ raise_exception('no system role') }}"),
    "template_reaches_python": _template("{{ messages.__class__.__mro__[1].__subclasses__() }}"),
    "template_undefined_filter": _template("{{ messages | shell }}"),
    "template_returns_nothing": _template(""),
    "template_loops_for_ever": _template("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"),
    "template_huge_range": _template("{% for i in range(10**12) %}x{% endfor %}"),
}
for label, change in VERIFIER_DIRS.items():
    expect = "either" if label == "template_returns_nothing" else "error"
    case("verifier3", f"{label}/generate", lambda c, ch=change: ["verifier", "generate", "hi", "--verifier", verifier_copy(c, ch), "--max_new_tokens", "2"],
         expect=expect, names=lambda c: [c.p("v"), "v"])
    case("verifier3", f"{label}/eval", lambda c, ch=change: eval_argv("--verifier", verifier_copy(c, ch))(c), expect=expect,
         names=lambda c: [c.p("v"), "v", "verifier"])
for label, prompt in {"lone_surrogate": "bad \udcff text", "lone_high_surrogate": "\ud800", "nul_byte": "a\x00b"}.items():
    case("verifier3", f"prompt_{label}", lambda c, p=prompt: ["verifier", "generate", p, "--verifier", c.verifier, "--max_new_tokens", "2"],
         expect="either" if label == "nul_byte" else "error", names=lambda c: ["prompt"])
for label, extra in {"hidden_1e6": ["--hidden", "1000000", "--heads", "1000", "--kv_heads", "1000"],
                     "layers_1e6": ["--layers", "1000000"], "hidden_odd_heads": ["--hidden", "100", "--heads", "3"]}.items():
    case("verifier3", f"standin_{label}", lambda c, e=extra: ["verifier", "standin", c.p("standin"), *e],
         names=lambda c: ["--hidden", "--layers", "hidden", "layers", "stand-in"])
case("verifier3", "benchmark_with_bad_records_says_how_many", eval_argv(bench=lambda c: f"gsm8k:{c.p('b.jsonl')}"),
     lambda c: write(c.d / "b.jsonl", jl({"question": "1+1?", "answer": "#### 2"}, "not json", {"question": 3}, {"answer": "x"}, "null")),
     expect="ok", check=lambda c, err: None if re.search(r"\d+ skipped", err) else "skipped records not reported", check_stderr=True)


# where results go
OUTPUTS = {
    "eval_output_proc": eval_argv(output=lambda c: "/proc/taps/report.json"),
    "eval_output_dev_null": eval_argv(output=lambda c: "/dev/null/report.json"),
    "eval_output_under_a_file": eval_argv(output=lambda c: c.good_data + "/report.json"),
    "eval_output_a_directory": eval_argv(output=lambda c: str(c.d)),
    "average_output_proc": avg_argv(output=lambda c: "/proc/taps/avg.ckpt"),
    "average_output_dev_null": avg_argv(output=lambda c: "/dev/null/avg.ckpt"),
    "average_output_under_a_file": avg_argv(output=lambda c: c.good_data + "/avg.ckpt"),
    "average_output_a_directory": avg_argv(output=lambda c: str(c.d)),
    "consolidate_root": lambda c: ["consolidate", "/"],
    "consolidate_proc": lambda c: ["consolidate", "/proc"],
    "consolidate_output_proc": lambda c: ["consolidate", c.ckpt, "--output", "/proc/taps/x.ckpt"],
    "report_out_a_file": lambda c: ["report", c.report, "--out", c.good_data],
    "report_out_proc": lambda c: ["report", c.report, "--out", "/proc/taps-report"],
    "report_out_under_a_file": lambda c: ["report", c.report, "--out", c.good_data + "/r"],
    "export_out_proc": lambda c: ["export", c.ckpt, "--out", "/proc/taps-export", "--no-embeddings"],
    "export_out_under_a_file": lambda c: ["export", c.ckpt, "--out", c.good_data + "/e", "--no-embeddings"],
    "study_out_root_proc": None,
}
for label, argv in OUTPUTS.items():
    if argv is None:
        study_case(label, setting_study("out_root", "/proc/taps-studies"), extra=(), field="out_root")
        continue
    case("output", label, argv, names=lambda c: ["--output", "--out", "output", "/proc", "/dev/null", c.good_data, "root", "directory"])


def _named_report(name: str):
    def files(c: Ctx) -> None:
        report = json.loads(Path(c.report).read_text())
        report["drafters"] = [name]
        write(c.d / "named.json", json.dumps(report))
    return files


def _escaped(c: Ctx, out: str) -> str | None:
    text = (c.d / "r" / "report.md").read_text() if (c.d / "r" / "report.md").exists() else ""
    bad = [line for line in text.splitlines() if line.startswith(("# pwned", "<script", "[link]"))]
    return f"report.md has raw markup lines: {bad[:2]}" if bad or not text else None


for label, name in {"newline_heading": "a\n# pwned", "pipe": "a|b|c", "html": "<script>alert(1)</script>", "link": "[link](http://x)\n[link]: y",
                    "carriage_return": "a\r# pwned", "unicode_line_separator": "a\u2028# pwned"}.items():
    case("output", f"report_drafter_name_{label}", lambda c: ["report", c.p("named.json"), "--out", c.p("r")], _named_report(name), "ok",
         check=_escaped)


# ------------------------------------------------------------------------------------------------ setup

def build_verifier(path: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from taps_train.data.corpora import gsm_symbolic_conversations
    from taps_train.verifier.offline.tokenizer import EOT, train_chat_tokenizer

    texts = [m["content"] for c in gsm_symbolic_conversations(60, seed=7) for m in c.messages]
    tokenizer = train_chat_tokenizer(texts, vocab_size=400)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.convert_tokens_to_ids(EOT), pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_checkpoint(verifier_dir: Path, path: Path, seed: int) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from taps_train.drafter import Drafter, drafter_config
    from taps_train.verifier.fingerprint import verifier_fingerprint

    verifier = AutoModelForCausalLM.from_pretrained(verifier_dir).eval()
    fingerprint = verifier_fingerprint(str(verifier_dir), AutoTokenizer.from_pretrained(verifier_dir))
    torch.manual_seed(seed)
    drafter = Drafter(drafter_config(verifier.config, False))
    drafter.load_verifier_parts(verifier)
    frozen = set(drafter.frozen_parameter_names())
    state = {f"drafter.{k}": v.clone() for k, v in drafter.state_dict().items() if k not in frozen}
    torch.save({"state_dict": state, "taps": {"drafter_config": drafter.config.to_dict(), "verifier": fingerprint}}, path)
    return str(path)


def setup(root: Path) -> Ctx:
    ctx = Ctx(root=root, marker=root / "MARKER_code_was_executed")
    ctx.verifier_dir = build_verifier(root / "verifier")
    ctx.verifier = str(ctx.verifier_dir)
    ctx.ckpt = build_checkpoint(ctx.verifier_dir, root / "good.ckpt", 1)
    ctx.ckpt2 = build_checkpoint(ctx.verifier_dir, root / "good2.ckpt", 2)
    ctx.good_data = str(root / "good_data.jsonl")
    write(ctx.good_data, jl(*goods(10)))
    write(root / "bench.jsonl", jl(*({"question": f"What is {i} + {i}?", "answer": f"Add.\n#### {2 * i}"} for i in range(3))))
    ctx.d = root / "_setup"
    ctx.d.mkdir()
    code, out, err, exc = run_main(["eval", "--drafters", ctx.ckpt, "--verifier", ctx.verifier, "--benchmarks", f"gsm8k:{root / 'bench.jsonl'}",
                                    "--prompts", "1", "--max-new-tokens", "4", "--output", str(ctx.d / "report.json")], 120)
    reports = sorted(ctx.d.glob("report*.json"))
    if not reports:
        print(f"setup: eval of the good checkpoint wrote no report (exit {code}): {(err or exc or '').strip()[-600:]}", file=sys.stderr)
        write(ctx.d / "report.json", json.dumps({"verifier": "x", "drafters": [ctx.ckpt], "strategy": "single", "temperature": 0.0,
                                                  "benchmarks": {"gsm8k": {"acceptance_length": 1.5, "verify_calls": 2, "new_tokens": 3}}}))
        reports = [ctx.d / "report.json"]
    ctx.report = str(reports[0])
    return ctx


# ------------------------------------------------------------------------------------------------- runner

class CaseTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise CaseTimeout()


def run_main(argv: list[str], timeout: int) -> tuple[int, str, str, str | None]:
    """(exit code, stdout, stderr, escaped exception's traceback or None)."""
    out, err = io.StringIO(), io.StringIO()
    code, exc = 0, None
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(argv)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            code = 1
            err.write(f"{e.code}\n")
    except CaseTimeout:
        code, exc = 124, f"timed out after {timeout}s"
    except BaseException as e:  # noqa: BLE001 - everything that escapes main() is a finding
        code, exc = 1, "".join(traceback.format_exception(e))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue(), exc


NOISE = re.compile(r"warn|deprecat|^\s*$|it/s|s/it|\d+%\|", re.I)


def error_lines(stderr: str) -> tuple[list[str], bool]:
    """The error line(s) and whether anything but noise follows the first one (a multi-line error)."""
    lines = stderr.splitlines()
    idx = [i for i, line in enumerate(lines) if re.search(r"\berror\b:?", line, re.I) and not NOISE.search(line)]
    if not idx:
        return [], False
    rest = [line for line in lines[idx[0] + 1:] if not NOISE.search(line)]
    return [lines[i] for i in idx], bool(rest)


def classify(c: Case, ctx: Ctx, code: int, out: str, err: str, exc: str | None) -> tuple[str, str]:
    """(category, detail)."""
    marker_hit = c.marker and ctx.marker.exists()
    if exc is not None:
        return "traceback", exc.strip().splitlines()[-1] if "timed out" not in exc else exc
    if "Traceback" in err:
        return "traceback", next((l for l in reversed(err.splitlines()) if l.strip()), "Traceback")
    check_problem = None
    if c.check is not None and (code == 0 or c.name.endswith(("overwrite", "no_overwrite")) or "equal" in c.name or "checkpoint" in c.name):
        try:
            check_problem = c.check(ctx, err if c.check_stderr else out)
        except Exception as e:  # noqa: BLE001
            check_problem = f"check raised {type(e).__name__}: {e}"
    if marker_hit:
        return "silent", "UNTRUSTED CODE WAS EXECUTED (marker file exists)"
    if code == 0:
        if c.expect == "error":
            return "silent", "exit 0; expected an error" + (f" (stdout: {out.strip().splitlines()[-1][:160]})" if out.strip() else "")
        if c.check is not None and check_problem:
            return "silent", f"exit 0 but wrong result: {check_problem}"
        return "survived", ""
    errors, multiline = error_lines(err)
    if not errors:
        tail = [l for l in err.splitlines() if l.strip()]
        return "unclear", f"exit {code}, no error line; stderr tail: {tail[-1][:200] if tail else '(empty)'}"
    first = errors[0]
    if len(errors) > 1 or multiline:
        return "traceback", f"multi-line error: {first[:240]}"
    if check_problem and c.expect == "error":
        return "silent", f"error but damage done: {check_problem}"
    names = c.names(ctx) if c.names else []
    named = any(n and n in first for n in names) or not names
    if c.expect == "ok":
        return "refused", first[:300]
    return ("clear" if named else "unclear"), first[:300]


def run_cases(ctx: Ctx, cases: list[Case], timeout: int) -> list[dict]:
    results = []
    for i, c in enumerate(cases):
        ctx.d = ctx.root / "cases" / f"{i:03d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', c.family + '_' + c.name)}"
        ctx.d.mkdir(parents=True)
        if ctx.marker.exists():
            ctx.marker.unlink()
        start = time.perf_counter()
        argv: list[str] = []
        try:
            if c.files is not None:
                c.files(ctx)
            argv = c.argv(ctx)
        except Exception as e:  # noqa: BLE001 - a harness bug: report it, keep going
            results.append({"family": c.family, "name": c.name, "argv": argv, "category": "harness-error", "detail": f"{type(e).__name__}: {e}",
                            "exit": None, "seconds": 0.0, "stderr_tail": ""})
            continue
        saved = dict(os.environ)
        os.environ.update(c.env(ctx) if c.env else {})
        try:
            code, out, err, exc = run_main(argv, timeout)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        category, detail = classify(c, ctx, code, out, err, exc)
        results.append({"family": c.family, "name": c.name, "argv": argv, "category": category, "detail": detail, "exit": code,
                        "seconds": round(time.perf_counter() - start, 2), "expect": c.expect,
                        "stderr_tail": (exc or err)[-1500:], "stdout_tail": out[-400:]})
        mark = {"clear": ".", "survived": "+"}.get(category, category[0].upper())
        print(mark, end="", file=sys.__stdout__, flush=True)
    print(file=sys.__stdout__)
    return results


def table(results: list[dict]) -> str:
    cats = list(CATEGORIES) + (["harness-error"] if any(r["category"] == "harness-error" for r in results) else [])
    families = sorted({r["family"] for r in results}, key=lambda f: [r["family"] for r in results].index(f))
    header = f"{'family':<12}{'cases':>6}" + "".join(f"{c:>11}" for c in cats)
    rows = [header, "-" * len(header)]
    for fam in families + ["TOTAL"]:
        sel = [r for r in results if fam == "TOTAL" or r["family"] == fam]
        rows.append(f"{fam:<12}{len(sel):>6}" + "".join(f"{sum(r['category'] == c for r in sel):>11}" for c in cats))
    return "\n".join(rows)


def main_cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None, help="families to run: data recipe verifier checkpoint eval export average report study")
    parser.add_argument("--json", default=None, help="save every result here")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per case")
    options = parser.parse_args()
    print(f"taps_train: {taps_train.__file__}")
    cases = [c for c in CASES if options.only is None or c.family in options.only]
    print(f"{len(cases)} cases ({len(CASES)} defined)")
    root = Path(tempfile.mkdtemp(prefix="taps-hostile-"))
    os.environ["TAPS_HOME"] = str(root / "taps_home")
    start = time.perf_counter()
    try:
        ctx = setup(root)
        print(f"setup {time.perf_counter() - start:.1f}s in {root}")
        results = run_cases(ctx, cases, options.timeout)
    finally:
        for dirpath, dirnames, _ in os.walk(root):
            for name in dirnames:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(dirpath, name), 0o755)
        if not options.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{table(results)}\n\nwall {time.perf_counter() - start:.0f}s\n")
    bad = [r for r in results if r["category"] not in ("clear", "survived")]
    if bad:
        print("cases that are not clear/survived:")
        for r in bad:
            print(f"  [{r['category']}] {r['family']}/{r['name']}: {r['detail']}")
    if options.json:
        Path(options.json).write_text(json.dumps({"taps_train": taps_train.__file__, "results": results}, indent=1))


if __name__ == "__main__":
    main_cli()
