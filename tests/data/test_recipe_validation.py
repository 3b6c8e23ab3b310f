"""Hostile recipes: the type and range of every field is checked, each failure one line naming the
recipe file, the dotted field and what it must be; and a recipe longer than the verifier's context is
refused before any features are cached."""

import dataclasses
import re

import pytest

from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import (
    REGENERATE_FIELDS,
    SOURCE_ARGS,
    Regenerate,
    load_recipe,
)
from taps_train.data.sources import SOURCES
from taps_train.errors import TapsError

GOOD = "  - {source: gsm_symbolic, args: {size: 40, seed: 1}, heldout: 2, count: 8}\n"


def recipe_text(top: str = "", source: str = GOOD) -> str:
    return f"name: hostile\n{top}sources:\n{GOOD}{source}"


HOSTILE = {
    # top level
    "seed null": (recipe_text("seed: null\n"), r"seed must be an integer seed"),
    "seed string": (recipe_text("seed: '3'\n"), r"seed must be an integer seed.*'3' \(str\)"),
    "seed bool": (recipe_text("seed: true\n"), r"seed must be an integer seed.*True \(bool\)"),
    "seed float": (recipe_text("seed: 1.5\n"), r"seed must be an integer seed"),
    "seed negative": (recipe_text("seed: -1\n"), r"seed must be an integer seed in \[0, "),
    "seed huge": (recipe_text("seed: 99999999999999999999\n"), r"seed must be an integer seed in \[0, "),
    "max_length zero": (recipe_text("max_length: 0\n"), r"max_length must be an integer >= 2, got 0"),
    "max_length negative": (recipe_text("max_length: -512\n"), r"max_length must be an integer >= 2"),
    "max_length float": (recipe_text("max_length: 512.0\n"), r"max_length must be an integer >= 2, got 512.0 \(float\)"),
    "max_length string": (recipe_text("max_length: '512'\n"), r"max_length must be an integer >= 2, got '512' \(str\)"),
    "max_length bool": (recipe_text("max_length: yes\n"), r"max_length must be an integer >= 2, got True \(bool\)"),
    "max_length null": (recipe_text("max_length: null\n"), r"max_length must be an integer >= 2, got None"),
    "name list": (recipe_text().replace("name: hostile", "name: [a, b]"), r"name must be a non-empty string"),
    "name empty": (recipe_text().replace("name: hostile", "name: ''"), r"name must be a non-empty string"),
    "unknown top key": (recipe_text("sead: 1\n"), r"unknown field\(s\) \['sead'\]; allowed: name, sources, max_length, seed"),
    "non-string key": (recipe_text("1: x\n"), r"field names must be strings"),
    "duplicate key": (recipe_text("seed: 0\nseed: 1\n"), r"not valid YAML.*duplicate key 'seed'"),
    "not a mapping": ("- source: gsm_symbolic\n", r"must be a mapping with 'name' and 'sources'"),
    "scalar file": ("just words\n", r"must be a mapping with 'name' and 'sources'"),
    "empty file": ("", r"must be a mapping with 'name' and 'sources', got None"),
    "empty sources": ("name: x\nsources: []\n", r"'sources' must be a non-empty list"),
    "sources mapping": ("name: x\nsources: {source: gsm_symbolic, count: 3}\n", r"'sources' must be a non-empty list"),
    "sources missing": ("name: x\n", r"'sources' must be a non-empty list"),
    # one source
    "source entry scalar": (recipe_text(source="  - gsm_symbolic\n"), r"sources\[1\] must be a mapping"),
    "source unknown key": (recipe_text(source="  - {source: gsm_symbolic, count: 2, held_out: 1}\n"), r"sources\[1\]: unknown field\(s\) \['held_out'\]"),
    "source name list": (recipe_text(source="  - {source: [jsonl], count: 2}\n"), r"sources\[1\]: unknown source \['jsonl'\].*set sources\[1\]\.source"),
    "source missing": (recipe_text(source="  - {count: 2}\n"), r"sources\[1\]: unknown source None.*set sources\[1\]\.source"),
    "count string": (recipe_text(source="  - {source: gsm_symbolic, count: '10'}\n"), r"sources\[1\]\.count must be a non-negative integer, got '10' \(str\)"),
    "count negative": (recipe_text(source="  - {source: gsm_symbolic, count: -5}\n"), r"sources\[1\]\.count must be a non-negative integer, got -5"),
    "count float": (recipe_text(source="  - {source: gsm_symbolic, count: 2.5}\n"), r"sources\[1\]\.count must be a non-negative integer, got 2\.5"),
    "count bool": (recipe_text(source="  - {source: gsm_symbolic, count: true}\n"), r"sources\[1\]\.count must be a non-negative integer, got True \(bool\)"),
    "count exponent": (recipe_text(source="  - {source: gsm_symbolic, count: 1e3}\n"), r"sources\[1\]\.count must be a non-negative integer, got '1e3'"),
    "count null": (recipe_text(source="  - {source: gsm_symbolic, count: null}\n"), r"sources\[1\]\.count must be a non-negative integer, got None"),
    "heldout negative": (recipe_text(source="  - {source: gsm_symbolic, count: 2, heldout: -1}\n"), r"sources\[1\]\.heldout must be a non-negative integer, got -1"),
    "heldout string": (recipe_text(source="  - {source: gsm_symbolic, count: 2, heldout: '10'}\n"), r"sources\[1\]\.heldout must be a non-negative integer"),
    "no samples": (recipe_text(source="  - {source: gsm_symbolic, count: 0, heldout: 0}\n"), r"sources\[1\]: set 'count'"),
    # source args
    "args list": (recipe_text(source="  - {source: gsm_symbolic, count: 2, args: [1]}\n"), r"sources\[1\]\.args must be a mapping of gsm_symbolic arguments \(size, seed\)"),
    "args unknown": (recipe_text(source="  - {source: gsm_symbolic, count: 2, args: {sise: 3}}\n"), r"sources\[1\]\.args: unknown field\(s\) \['sise'\]; allowed: size, seed"),
    "args.size string": (recipe_text(source="  - {source: gsm_symbolic, count: 2, args: {size: '10'}}\n"), r"sources\[1\]\.args\.size must be a positive integer, got '10' \(str\)"),
    "args.size zero": (recipe_text(source="  - {source: gsm_symbolic, count: 2, args: {size: 0}}\n"), r"sources\[1\]\.args\.size must be a positive integer, got 0"),
    "args.seed null": (recipe_text(source="  - {source: gsm_symbolic, count: 2, args: {seed: null}}\n"), r"sources\[1\]\.args\.seed must be an integer seed"),
    "args.path null": (recipe_text(source="  - {source: jsonl, count: 2, args: {path: null}}\n"), r"sources\[1\]\.args\.path must be a non-empty string, got None"),
    "args.path int": (recipe_text(source="  - {source: jsonl, count: 2, args: {path: 123}}\n"), r"sources\[1\]\.args\.path must be a non-empty string, got 123 \(int\)"),
    "args.path list": (recipe_text(source="  - {source: jsonl, count: 2, args: {path: [a.jsonl]}}\n"), r"sources\[1\]\.args\.path must be a non-empty string, got \['a\.jsonl'\] \(list\)"),
    "args.path missing": (recipe_text(source="  - {source: jsonl, count: 2}\n"), r"sources\[1\]\.args\.path is required for source jsonl"),
    "args.path absent file": (recipe_text(source="  - {source: jsonl, count: 2, args: {path: /no/such/file.jsonl}}\n"), r"sources\[1\]\.args\.path /no/such/file\.jsonl does not exist"),
    "args.location int": (recipe_text(source="  - {source: sharegpt, count: 2, args: {location: 5}}\n"), r"sources\[1\]\.args\.location must be a non-empty string"),
    "args.revision int": (recipe_text(source="  - {source: mathinstruct, count: 2, args: {revision: 1234}}\n"), r"sources\[1\]\.args\.revision must be a non-empty string or null"),
    "args.filename empty": (recipe_text(source="  - {source: mathinstruct, count: 2, args: {filename: ''}}\n"), r"sources\[1\]\.args\.filename must be a non-empty string"),
    # regenerate
    "regenerate scalar": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: often}\n"), r"sources\[1\]\.regenerate must be true, false or a mapping"),
    "regenerate unknown": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {temprature: 1}}\n"), r"sources\[1\]\.regenerate: unknown field\(s\) \['temprature'\]"),
    "max_new_tokens zero": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {max_new_tokens: 0}}\n"), r"sources\[1\]\.regenerate\.max_new_tokens must be a positive integer, got 0"),
    "max_new_tokens negative": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {max_new_tokens: -3}}\n"), r"sources\[1\]\.regenerate\.max_new_tokens must be a positive integer"),
    "max_new_tokens float": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {max_new_tokens: 12.5}}\n"), r"sources\[1\]\.regenerate\.max_new_tokens must be a positive integer"),
    "max_new_tokens string": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {max_new_tokens: '64'}}\n"), r"sources\[1\]\.regenerate\.max_new_tokens must be a positive integer, got '64' \(str\)"),
    "temperature word": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {temperature: hot}}\n"), r"sources\[1\]\.regenerate\.temperature must be a finite number >= 0 \(0 is greedy\), got 'hot' \(str\)"),
    "temperature negative": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {temperature: -0.5}}\n"), r"sources\[1\]\.regenerate\.temperature must be a finite number >= 0"),
    "temperature nan": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {temperature: .nan}}\n"), r"sources\[1\]\.regenerate\.temperature must be a finite number >= 0 \(0 is greedy\), got nan"),
    "temperature inf": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {temperature: .inf}}\n"), r"sources\[1\]\.regenerate\.temperature must be a finite number >= 0 \(0 is greedy\), got inf"),
    "temperature bool": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {temperature: true}}\n"), r"sources\[1\]\.regenerate\.temperature must be a finite number"),
    "regenerate seed null": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {seed: null}}\n"), r"sources\[1\]\.regenerate\.seed must be an integer seed"),
    "regenerate seed string": (recipe_text(source="  - {source: gsm_symbolic, count: 2, regenerate: {seed: '1'}}\n"), r"sources\[1\]\.regenerate\.seed must be an integer seed"),
    # file-level
    "invalid yaml": ("name: [unclosed\n", r"is not valid YAML"),
}


@pytest.mark.parametrize(("text", "message"), list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_recipe_is_one_line_naming_file_and_field(tmp_path, text, message):
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    with pytest.raises(TapsError) as error:
        load_recipe(path)
    text = str(error.value)
    assert re.search(message, text), text
    assert str(path) in text and "\n" not in text


def test_binary_recipe_file_is_one_line(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(TapsError, match=r"is not UTF-8 text") as error:
        load_recipe(path)
    assert str(path) in str(error.value)


def test_valid_edge_forms_still_load(tmp_path):
    """Anchors and merge keys, null args, `regenerate: {}` and integer temperatures are all fine."""
    path = tmp_path / "edge.yaml"
    path.write_text(
        "name: edge\nseed: 7\nmax_length: 2\nsources:\n"
        "  - &math {source: gsm_symbolic, args: {size: 40, seed: 1}, heldout: 2, count: 8}\n"
        "  - {<<: *math, count: 4, regenerate: {temperature: 1}}\n"
        "  - {source: gsm_symbolic, args: null, count: 3, regenerate: {}}\n"
    )
    recipe = load_recipe(path)
    assert (recipe.name, recipe.seed, recipe.max_length) == ("edge", 7, 2)
    assert [s.count for s in recipe.sources] == [8, 4, 3]
    assert recipe.sources[1].args == {"size": 40, "seed": 1} and recipe.sources[2].args == {}
    assert recipe.sources[1].regenerate == Regenerate(temperature=1.0) and isinstance(recipe.sources[1].regenerate.temperature, float)
    assert recipe.sources[2].regenerate == Regenerate()


def test_validation_tables_cover_every_source_and_regenerate_field():
    assert set(SOURCE_ARGS) == set(SOURCES)
    for name, cls in SOURCES.items():
        assert set(SOURCE_ARGS[name]) == {f.name for f in dataclasses.fields(cls)}, name
    assert set(REGENERATE_FIELDS) == {f.name for f in dataclasses.fields(Regenerate)}


def test_max_length_beyond_the_verifier_context_is_refused(tmp_path, random_verifier_dir):
    path = tmp_path / "long.yaml"
    path.write_text("name: long\nmax_length: 513\nsources:\n" + GOOD)
    with pytest.raises(TapsError) as error:
        RecipePreparer(load_recipe(path), str(random_verifier_dir), tmp_path / "cache")
    text = str(error.value)
    assert "max_length 513" in text and str(random_verifier_dir) in text and "512" in text and "\n" not in text
    path.write_text("name: fits\nmax_length: 512\nsources:\n" + GOOD)
    assert RecipePreparer(load_recipe(path), str(random_verifier_dir), tmp_path / "cache").recipe.max_length == 512
