"""ShareGPT topics: `code` and `prose` split the pool into two disjoint domains, what a topic leaves out is
counted, a bad topic is refused in one line, and sources without a topic keep their cache keys."""

import json

import pytest

from taps_train.data.recipe import load_recipe, select
from taps_train.data.sources import ShareGPT, describe, has_code
from taps_train.errors import TapsError


def write_pool(path, n: int = 12):
    records = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"question {i}"},
                                                 {"from": "gpt", "value": f"```python\nprint({i})\n```" if i % 3 == 0 else f"answer {i}"}]}
               for i in range(n)]
    path.write_text(json.dumps(records))
    return path


def test_code_and_prose_partition_the_pool_and_count_what_they_leave_out(tmp_path):
    path = write_pool(tmp_path / "pool.json")
    everything, _ = ShareGPT(location=str(path)).load()
    code, code_report = ShareGPT(location=str(path), topic="code").load()
    prose, prose_report = ShareGPT(location=str(path), topic="prose").load()
    assert [c.id for c in code] == ["c0", "c3", "c6", "c9"] and all(has_code(c) for c in code)
    assert sorted(c.id for c in code + prose) == sorted(c.id for c in everything)
    assert code_report.excluded == {"not topic code": 8} and prose_report.excluded == {"not topic prose": 4}
    assert "8 left out: not topic code" in code_report.summary()


def test_topics_have_their_own_cache_keys_and_all_keeps_the_old_ones(tmp_path):
    path = write_pool(tmp_path / "pool.json")
    assert "topic" not in describe(ShareGPT(location=str(path)))
    assert ShareGPT(location=str(path)).fingerprint() == ShareGPT(location=str(path), topic="all").fingerprint()
    keys = {ShareGPT(location=str(path), topic=t).fingerprint() for t in ("all", "code", "prose")}
    assert len(keys) == 3


@pytest.mark.parametrize("topic, message", [("cooking", r"topic must be one of \['all', 'code', 'prose'\], got 'cooking'"),
                                            (3, r"args\.topic must be a non-empty string")])
def test_a_bad_topic_is_refused_naming_the_recipe_and_field(tmp_path, topic, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nsources:\n  - source: sharegpt\n    args: {{location: package, topic: {json.dumps(topic)}}}\n    count: 3\n")
    with pytest.raises(TapsError, match=rf"recipe {recipe}: sources\[0\].*{message}"):
        load_recipe(recipe)


def test_offline_code_and_prose_recipes_are_disjoint():
    code = select(load_recipe("data_recipes/tiny_code.yaml").sources[0], 0)
    prose = select(load_recipe("data_recipes/tiny_prose.yaml").sources[0], 0)
    assert len(code.train) == len(prose.train) == 2000 and len(code.heldout) == len(prose.heldout) == 200
    code_ids = {c.id for c in code.train + code.heldout}
    assert not code_ids & {c.id for c in prose.train + prose.heldout}
