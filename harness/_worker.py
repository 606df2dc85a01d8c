"""A worker process of `WorkerPool`: reads pickled calls on standard input, one at a time, runs
each, and answers on the pipe whose descriptor is its first argument with a pickled None or the
call's error (`_answer`): nothing a module prints can get into an answer.
Its further arguments are modules to import before the first call. Ends at the end of its
input."""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import traceback

from harness._errors import InputError
from harness._workers import WorkerError, read_message, write_message


def main() -> None:
    answers = os.fdopen(int(sys.argv[1]), "wb")
    for module in sys.argv[2:]:
        importlib.import_module(module)

    while (call := read_message(sys.stdin.buffer)) is not None:
        try:
            function, args, kwargs = pickle.loads(call)
            function(*args, **kwargs)
            answer: BaseException | None = None
        except Exception as error:
            answer = _answer(error, traceback.format_exc().rstrip())
        try:
            write_message(answers, pickle.dumps(answer))
        except BrokenPipeError:  # the caller is gone (killed outright): no one to answer, nor to tell
            return


def _answer(error: Exception, trace: str) -> BaseException:
    """The error as the caller should see it: the machine's or the input's (a full disk, a bad
    file) as itself, so that it is one line at the command line; anything else as a WorkerError
    whose message is the traceback."""
    if isinstance(error, OSError | MemoryError | InputError):
        try:
            again = pickle.loads(pickle.dumps(error))
        except Exception:  # an error that does not survive the pipe
            return WorkerError(trace)
        if type(again) is type(error) and str(again) == str(error):
            again.add_note(f"in a worker process:\n{trace}")
            return again
    return WorkerError(trace)


if __name__ == "__main__":
    main()
