"""Data sources: where conversations come from, each a small typed class with `load()`.

A source returns its whole pool of usable conversations in a fixed order plus a report of what it
skipped; recipes decide which samples to take. `fingerprint()` identifies the pool's content so
feature caches built from it can be recognised and reused.
"""

from dataclasses import asdict, dataclass
from pathlib import Path

from taps_train.data.conversation import BadRecord, Conversation
from taps_train.data.corpora import (
    gsm_symbolic_conversations,
    read_conversations,
    sharegpt_package_path,
)
from taps_train.data.records import ReadReport, read_records
from taps_train.errors import TapsError
from taps_train.hashing import file_sha256

PACKAGE = "package"


def _local_or_hub_file(location: str, filename: str, revision: str | None) -> Path:
    """A local file path as is; otherwise `filename` from the hub dataset repo `location`."""
    path = Path(location).expanduser()
    if path.is_file():
        return path
    if path.exists() or location.startswith((".", "/", "~")):
        raise TapsError(f"data file {location} does not exist or is not a file; fix the path in the recipe")
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(location, filename, repo_type="dataset", revision=revision))
    except Exception as err:  # hub errors come in many types; all mean "not available here"
        raise TapsError(
            f"cannot fetch {filename} from hub dataset {location} ({type(err).__name__}); "
            "download it and point `location` at the local file, or use an offline source"
        ) from err



TOPICS = ("all", "code", "prose")
CODE_FENCE = "```"


@dataclass(frozen=True)
class ShareGPT:
    """ShareGPT conversations: a hub dataset repo, a local JSON/JSONL file, or `package` (offline copy).

    `topic` splits the pool into two domains: `code`, conversations where an assistant turn holds a fenced
    code block (a third of the offline copy), and `prose`, the others; `all` keeps every conversation."""

    location: str = "Aeala/ShareGPT_Vicuna_unfiltered"
    filename: str = "ShareGPT_V4.3_unfiltered_cleaned_split.json"
    revision: str | None = None
    topic: str = "all"

    def __post_init__(self) -> None:
        if self.topic not in TOPICS:
            raise TapsError(f"sharegpt topic must be one of {list(TOPICS)}, got {self.topic!r}")

    def path(self) -> Path:
        if self.location == PACKAGE:
            return sharegpt_package_path()
        return _local_or_hub_file(self.location, self.filename, self.revision)

    def load(self) -> tuple[list[Conversation], ReadReport]:
        conversations, report = read_conversations(self.path())
        if self.topic == "all":
            return conversations, report
        kept = [c for c in conversations if has_code(c) == (self.topic == "code")]
        report.excluded[f"not topic {self.topic}"] += len(conversations) - len(kept)
        return kept, report

    def fingerprint(self) -> str:
        return f"sharegpt:{file_sha256(self.path())}" + ("" if self.topic == "all" else f":topic={self.topic}")


def has_code(conversation: Conversation) -> bool:
    return any(m["role"] == "assistant" and CODE_FENCE in m["content"] for m in conversation.messages)


@dataclass(frozen=True)
class MathInstruct:
    """TIGER-Lab/MathInstruct (`instruction` / `output` records) from the hub or a local file."""

    location: str = "TIGER-Lab/MathInstruct"
    filename: str = "MathInstruct.json"
    revision: str | None = None

    def path(self) -> Path:
        return _local_or_hub_file(self.location, self.filename, self.revision)

    def load(self) -> tuple[list[Conversation], ReadReport]:
        report = ReadReport(str(self.path()))
        conversations = []
        for index, record in enumerate(read_records(self.path(), report)):
            try:
                conversations.append(_instruction_record(record, f"mathinstruct:{index}"))
            except BadRecord as reason:
                report.problems[str(reason)] += 1
        return conversations, report

    def fingerprint(self) -> str:
        return f"mathinstruct:{file_sha256(self.path())}"


def _instruction_record(record: object, fallback_id: str) -> Conversation:
    from taps_train.data.conversation import to_conversation

    if not isinstance(record, dict):
        raise BadRecord("record is not an object")
    messages = [{"role": "user", "content": record.get("instruction")}, {"role": "assistant", "content": record.get("output")}]
    return to_conversation({"id": record.get("id", fallback_id), "messages": messages}, fallback_id)


@dataclass(frozen=True)
class GsmSymbolic:
    """A seeded pool of reasoning-gym `gsm_symbolic` problems with chain-of-thought answers (offline)."""

    size: int = 1000
    seed: int = 0

    def load(self) -> tuple[list[Conversation], ReadReport]:
        if self.size <= 0:
            raise TapsError(f"gsm_symbolic size must be positive, got {self.size}")
        conversations = gsm_symbolic_conversations(self.size, self.seed)
        report = ReadReport(f"gsm_symbolic(size={self.size}, seed={self.seed})", records=len(conversations))
        return conversations, report

    def fingerprint(self) -> str:
        import reasoning_gym

        return f"gsm_symbolic:{self.size}:{self.seed}:reasoning_gym-{reasoning_gym.__version__}"


@dataclass(frozen=True)
class Jsonl:
    """Any local JSON/JSONL file of ShareGPT (`conversations`) or OpenAI (`messages`) records."""

    path: str

    def load(self) -> tuple[list[Conversation], ReadReport]:
        return read_conversations(Path(self.path).expanduser())

    def fingerprint(self) -> str:
        path = Path(self.path).expanduser()
        if not path.is_file():
            raise TapsError(f"data file {path} does not exist or is not a file; fix the path in the recipe")
        return f"jsonl:{file_sha256(path)}"


SOURCES = {"sharegpt": ShareGPT, "mathinstruct": MathInstruct, "gsm_symbolic": GsmSymbolic, "jsonl": Jsonl}


def make_source(name: str, args: dict) -> ShareGPT | MathInstruct | GsmSymbolic | Jsonl:
    """Instantiate a registered source, with errors that name the source and the bad argument."""
    if name not in SOURCES:
        raise TapsError(f"unknown data source {name!r}; known sources: {', '.join(SOURCES)}")
    try:
        return SOURCES[name](**args)
    except TypeError as err:
        raise TapsError(f"bad arguments for source {name!r}: {err}") from err


def describe(source: object) -> dict:
    fields = asdict(source)
    if isinstance(source, ShareGPT) and source.topic == "all":
        del fields["topic"]  # the description (and cache keys) of every ShareGPT source before topics existed
    return {"type": next(k for k, v in SOURCES.items() if isinstance(source, v)), **fields}
