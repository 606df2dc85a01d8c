"""A figure worker of `FigurePool`: reads pickled figure calls on standard input, one at a time,
draws each, and answers on its own copy of standard output with a pickled None or `FigureError`
(whose message is the traceback). Anything printed goes to standard error, never into the
answers. Ends at the end of its input."""

from __future__ import annotations

import os
import pickle
import sys
import traceback

from harness.report._render import FigureError, read_message, write_message


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print cannot corrupt an answer
    import harness.report._figures  # noqa: F401  (matplotlib, before the first figure is timed)

    while (call := read_message(sys.stdin.buffer)) is not None:
        try:
            function, args, kwargs = pickle.loads(call)
            function(*args, **kwargs)
            answer = None
        except Exception:
            answer = FigureError(traceback.format_exc().rstrip())
        write_message(answers, pickle.dumps(answer))


if __name__ == "__main__":
    main()
