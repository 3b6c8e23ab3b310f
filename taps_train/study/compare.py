"""Another study's claims table, read back from its report.md, so that one study's claims can stand beside another's
(the same experiment on another verifier: `compare_with`)."""

import re
from pathlib import Path

from taps_train.errors import TapsError

MAX_BYTES = 16 * 2**20  # a report.md is kilobytes; anything near this is not one
CLAIM_ROW = re.compile(r"^\| (RQ\d) \| ([^|]+) \| ([^|]+) \| ([^|]+) > ([^|]+) \| ([^|]+) \| ([^|]+) \| (supported|contradicted|not resolved) \|$")


def read_claims(path: str | Path) -> dict[tuple[str, str, str, str, str], tuple[str, str]]:
    """The claims table of another study's report.md (or a file holding that table): (question, backbone, T, claim,
    benchmark) -> (Δτ [interval], verdict), with a best single specialist named `best single` (it may differ)."""
    try:
        if not Path(path).is_file() or Path(path).stat().st_size > MAX_BYTES:
            raise TapsError(f"compare_with: {path} is not a report file (a regular file under {MAX_BYTES // 2**20} MiB); pass another "
                            "study's report.md")
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise TapsError(f"compare_with: cannot read {path}: {getattr(err, 'strerror', None) or err}; pass another study's report.md") from None
    claims = {}
    for line in lines:
        match = CLAIM_ROW.match(line.strip())
        if match:
            question, backbone, temperature, better, worse, where, interval, verdict = (part.strip() for part in match.groups())
            where = where.split(", n=")[0]  # reports since the interval method changed name each interval's prompts
            claims[question, backbone, temperature, generic_claim(question, better, worse), where] = (f"{interval} ({better} > {worse})", verdict)
    if not claims:
        raise TapsError(f"compare_with: {path} holds no claims table (rows such as '| RQ1 | eagle2 | 0 | math > chat | "
                        "math_heldout | +0.5 [+0.2, +0.8] | supported |'); pass another study's report.md")
    return claims


def generic_claim(question: str, better: str, worse: str) -> str:
    """An RQ3 claim with its backbone's best single specialist named as such, so that studies whose best differs pair."""
    if question == "RQ3" and worse == "average":
        return "best single > average"
    if question == "RQ3" and better == "route-confidence" and worse != "route-entropy":
        return "route-confidence > best single"
    return f"{better} > {worse}"
