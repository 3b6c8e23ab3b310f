"""What a study YAML says (configs/study/*.yaml): one dataclass field per key, parsed by jsonargparse.

A study is the TAPS comparison at one scale: every backbone trained on every domain (specialists) and
every mixture recipe, each drafter evaluated alone, every strategy over the specialists, and a λ sweep of
weight averaging, all at every temperature on the domains' held-out benchmarks.
"""

from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path

from taps_train.errors import TapsError
from taps_train.data.recipe import load_recipe
from taps_train.fit_config import FIX, check_trainer_options, fit_config_problems
from taps_train.paths import writable_directory
from taps_train.eval.settings import benchmark_problem, temperatures_problem, verifier_problem
from taps_train.decoding.tree import TreeConfig, tree_problems
from taps_train.ranges import int_problem
from taps_train.decoding.strategies import STRATEGIES
from taps_train.study.compare import read_claims
from taps_train.user_yaml import read_yaml
from taps_train.verifier.loading import DEFAULT_VERIFIER


TREES = ("fixed", "auto")  # `taps-train eval --tree`


@dataclass
class Domain:
    """A domain: the recipe its specialist trains on and the held-out benchmarks that measure it."""

    recipe: str
    benchmarks: list[str]


@dataclass
class Tree:
    """The study file's tree (`taps-train eval --total-tokens --depth --top-k`), also the bound `--tree auto` searches
    within: the paper's `TreeConfig` by default, read as written and checked by its rule with the study's other keys,
    so that a study names all its problems at once."""

    total_tokens: int = TreeConfig.total_tokens
    depth: int = TreeConfig.depth
    top_k: int = TreeConfig.top_k


@dataclass
class Study:
    """name: the study's folder under `out_root`. backbones: backbone name -> a `taps-train fit` config whose
    model, optimizer and callbacks every cell of that backbone uses (recipe, steps, seed, verifier and output
    folders are the study's). max_steps: every fit's budget (None: each config's own, e.g. the paper's 20 epochs). mixtures: name -> a mixture recipe, trained by every backbone. strategies: how
    the specialists are combined (`taps-train eval --strategy`; `average` is uniform). lambdas: weights of the
    first domain's specialist in a two-domain averaging sweep. prompts, max_new_tokens: per benchmark, for
    every evaluation. baseline: the trees whose evaluations also decode every prompt plainly, for the speedup next to
    τ (up to twice the evaluation time; [] for τ alone). trees: `fixed` evaluates every variant with `tree` (the paper's, so τ compares
    with the paper); `auto` evaluates the drafters and strategies again with the tree `eval --tree auto` chooses for
    this machine within `tree`, calibrated once per backbone on its first mixture's drafter (else the first domain's)
    so that every variant runs the same shape (the speedup a user of this machine gets; λ sweeps stay fixed-tree).
    report_dir: where report.md and its PNGs go (default `<out_root>/<name>/report`; the auto tree's in `auto_tree/`).
    compare_with: another study's report.md (e.g. the same study on another verifier): its claims beside this one's."""

    name: str
    domains: dict[str, Domain]
    backbones: dict[str, str]
    verifier: str = DEFAULT_VERIFIER
    mixtures: dict[str, str] = field(default_factory=dict)
    max_steps: int | None = 500
    strategies: list[str] = field(default_factory=lambda: ["average", "route-entropy", "route-confidence", "merge", "merge-budget"])
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    tree: Tree = field(default_factory=Tree)
    trees: list[str] = field(default_factory=lambda: ["fixed"])
    prompts: int = 20
    max_new_tokens: int = 64
    baseline: list[str] = field(default_factory=lambda: list(TREES))
    lambdas: list[float] = field(default_factory=list)
    seed: int = 0
    out_root: str = "checkpoints/studies"
    report_dir: str | None = None
    compare_with: str | None = None

    @property
    def out_dir(self) -> Path:
        return Path(self.out_root) / self.name

    @property
    def benchmarks(self) -> list[str]:
        """Every domain's benchmarks, in domain order, each once."""
        return list(dict.fromkeys(name for domain in self.domains.values() for name in domain.benchmarks))

    def check(self) -> None:
        """Refuse what would fail hours in: missing files, unknown strategies, impossible sweeps."""
        problems = []
        if len(self.domains) < 2:
            problems.append(f"domains: a study compares specialists of two or more domains, got {len(self.domains)}")
        if not self.backbones:
            problems.append("backbones: name at least one backbone and its fit config")
        names = [*self.domains, *self.mixtures]
        if len(set(names)) != len(names):
            problems.append(f"domains and mixtures share a name: {sorted(n for n in set(names) if names.count(n) > 1)}")
        for name in [self.name, *names, *self.backbones]:
            if not name.replace("_", "").replace("-", "").isalnum():
                problems.append(f"{name!r}: names become folder names; use letters, digits, - and _")
        for name, domain in self.domains.items():
            if not domain.benchmarks:
                problems.append(f"domains.{name}.benchmarks: name at least one held-out benchmark")
            for spec in domain.benchmarks:
                problem = benchmark_problem(spec)
                path = spec.partition(":")[2]
                if problem:
                    problems.append(f"domains.{name}.benchmarks: {problem}")
                elif path and not Path(path).is_file():
                    problems.append(f"domains.{name}.benchmarks: {spec}: {path} does not exist")
        files = {f"domains.{n}.recipe": d.recipe for n, d in self.domains.items()}
        files |= {f"mixtures.{n}": path for n, path in self.mixtures.items()}
        files |= {f"backbones.{n}": path for n, path in self.backbones.items()}
        problems += [f"{key}: {path} does not exist (relative paths start at the current directory)"
                     for key, path in files.items() if not Path(path).is_file()]
        for key, path in files.items():
            if Path(path).is_file() and not key.startswith("backbones."):
                try:
                    load_recipe(path)
                except TapsError as err:
                    problems.append(f"{key}: {err}")
        for name, path in self.backbones.items():
            if Path(path).is_file():
                problems += _backbone_config_problems(name, path)
        known = sorted({*STRATEGIES, "average"} - {"single"})
        unknown = [s for s in self.strategies if s not in known]
        if unknown:
            problems.append(f"strategies: {unknown} are not composition strategies; use {known}")
        if self.lambdas and len(self.domains) != 2:
            problems.append(f"lambdas: a λ sweep interpolates two specialists; this study has {len(self.domains)} domains")
        if any(not (isinstance(value, int | float) and 0 <= value <= 1) for value in self.lambdas):
            problems.append(f"lambdas: every λ lies in [0, 1], got {self.lambdas}")
        for key, values in (("strategies", self.strategies), ("lambdas", self.lambdas), ("temperatures", self.temperatures),
                            ("baseline", self.baseline), *((f"domains.{n}.benchmarks", d.benchmarks) for n, d in self.domains.items())):
            values = list(values)
            repeated = list(dict.fromkeys(repr(values[values.index(v)]) for i, v in enumerate(values) if isinstance(v, Hashable) and v in values[:i]))
            if repeated:
                problems.append(f"{key}: {', '.join(repeated)} given more than once (each is run once); name each once")
        if self.report_dir is not None:
            try:
                writable_directory(self.report_dir, "report_dir", "pass a folder to write the report into")
            except TapsError as err:
                problems.append(str(err))
        if self.compare_with is not None:
            try:
                read_claims(self.compare_with)
            except TapsError as err:
                problems.append(str(err))
        if not self.trees or len(set(self.trees)) != len(self.trees) or not set(self.trees) <= set(TREES):
            problems.append(f"trees: {self.trees}: name each of {list(TREES)} at most once (fixed: `tree`; auto: the machine's choice within it)")
        if not set(self.baseline) <= set(TREES):
            problems.append(f"baseline: {self.baseline}: name trees of {list(TREES)} (those whose evaluations measure the speedup), or []")
        problems += [f"{key}: {problem}" for key, problem in self._run_problems().items() if problem]
        if problems:
            raise TapsError(f"study {self.name}: " + "; ".join(problems))


    def _run_problems(self) -> dict[str, str | None]:
        """What `fit` and `eval` would refuse in the settings every cell passes them (the same rules: eval/settings.py)."""
        return {
            "max_steps": None if self.max_steps is None else int_problem(self.max_steps, 1, "at least 1 step (or null: each config's own)"),
            "prompts": int_problem(self.prompts, 1, "at least 1 prompt per benchmark"),
            "max_new_tokens": int_problem(self.max_new_tokens, 1, "at least 1"),
            "seed": int_problem(self.seed, 0, "a seed >= 0"),
            **{f"tree.{name}": problem for name, problem in tree_problems(self.tree.total_tokens, self.tree.depth, self.tree.top_k,
                                                                          plain=False).items()},
            "temperatures": temperatures_problem(self.temperatures),
            "verifier": verifier_problem(self.verifier),
        }


def check_study_file(path: str) -> None:
    """A readable YAML mapping, or one line naming the file (before jsonargparse, which would print a foreign file)."""
    data = read_yaml(path, "study file", "pass a study YAML (see configs/study/)")
    if not isinstance(data, dict):
        raise TapsError(f"study file {path} is not a YAML mapping of study keys (name, domains, backbones, ...); see configs/study/")


def _backbone_config_problems(name: str, path: str) -> list[str]:
    """The backbone's fit config, read and shaped as `fit` will read it (every cell of the backbone runs it)."""
    try:
        config = read_yaml(path, "fit config", FIX)
    except TapsError as err:
        return [f"backbones.{name}: {err}"]
    problems = fit_config_problems(config)
    if not problems and not (isinstance(config.get("model"), dict) and isinstance(config.get("data"), dict)):
        problems = ["it has no model and data sections"]
    if not problems:
        try:
            check_trainer_options(config.get("trainer") or {})
        except TapsError as err:
            problems = [str(err)]
    return [f"backbones.{name}: {path}: {problem}" for problem in problems[:1]]
