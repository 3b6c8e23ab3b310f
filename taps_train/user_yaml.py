"""Reading YAML files users hand taps-train (recipes, study files, fit configs), as a hostile file demands.

Safe construction only (no Python objects), and three limits PyYAML's SafeLoader lacks:

- a key written twice in one mapping is refused (the later one would silently win); keys merged in with
  `<<: *anchor` may still be overridden, as YAML intends;
- aliases are bounded: each alias shares the anchored object, so a ten-line file of nested anchors builds a
  tree of billions of elements the moment anything walks it (validation, jsonargparse, JSON); a config uses a
  handful, so more than `MAX_ALIASES` is refused while parsing;
- dates and times stay strings: a YAML timestamp would become a `datetime` that no config field takes and
  JSON cannot write.
"""

from pathlib import Path
from typing import Any

import yaml

from taps_train.errors import TapsError
from taps_train.paths import read_at_most

MAX_ALIASES = 64
MAX_BYTES = 16 * 2**20  # configs and recipes are a few KB


class UserYamlLoader(yaml.SafeLoader):
    """SafeLoader with unique keys, bounded aliases and timestamps as strings."""

    def __init__(self, stream):
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(None, None, f"more than {MAX_ALIASES} aliases (*name)", self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key_node.value!r}", key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


UserYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def read_yaml(path: str | Path, what: str, fix: str) -> Any:
    """The parsed file, or one `TapsError` line naming `what` (e.g. "recipe"), the file, the problem and `fix`."""
    path = Path(path)
    try:
        raw = read_at_most(path, MAX_BYTES)
    except OSError as err:
        raise TapsError(f"cannot read {what} {path}: {err.strerror or err}; {fix}") from err
    if raw is None:
        raise TapsError(f"{what} {path} is larger than {MAX_BYTES // 2**20} MiB, which no {what} is; {fix}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TapsError(f"{what} {path} is not UTF-8 text ({err.reason} at byte {err.start}); {fix}") from err
    try:
        return yaml.load(text, Loader=UserYamlLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as err:
        raise TapsError(f"{what} {path} is not valid YAML: {' '.join(str(err).split())}; {fix}") from err
    except RecursionError as err:
        raise TapsError(f"{what} {path} is nested too deeply; {fix}") from err
