"""Turning what the argument libraries raise into one line that names the file and key."""


from taps_train.errors import TapsError


def config_files(args: list[str]) -> list[str]:
    """The --config / -c files of a LightningCLI command line."""
    files = [value for flag, value in zip(args, args[1:]) if flag in ("--config", "-c")]
    return files + [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]


def config_error(err: Exception, args: list[str], command: str) -> str:
    """jsonargparse's refusal (a key and its problem, over several lines) as one line that starts with the config
    files and the key; its detail follows, shortened."""
    detail = " ".join(str(err).split())
    files = config_files(args)
    where = f"{command} config {', '.join(files)}" if files else f"taps-train {command} options"
    if len(detail) > 600:
        detail = detail[:600] + " ..."
    return f"{where}: {detail}; see `taps-train {command} --help` for the keys and their types"


def wrapped_taps_error(err: BaseException) -> TapsError | None:
    """The TapsError that jsonargparse/Lightning wrapped into `err`, if the chain down to it holds only
    their wrappers (ValueError, jsonargparse's and argparse's errors); otherwise None (a genuine bug)."""
    import argparse

    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TapsError):
            return current
        wrapper = isinstance(current, (ValueError, argparse.ArgumentError)) or type(current).__module__.startswith("jsonargparse")
        if not wrapper:
            return None
        current = current.__cause__ or current.__context__
    return None
