"""A figure worker of `FigurePool`: reads pickled figure calls on standard input, one at a time,
draws each, and answers on the pipe whose descriptor is its argument with a pickled None or
`FigureError` (whose message is the traceback): nothing a module prints can get into an answer.
Ends at the end of its input."""

from __future__ import annotations

import os
import pickle
import sys
import traceback

from harness.report._render import FigureError, read_message, write_message


def main() -> None:
    answers = os.fdopen(int(sys.argv[1]), "wb")
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
