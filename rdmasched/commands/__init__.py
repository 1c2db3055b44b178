"""The commands of `rdmasched`, one module each (the shell that assembles them is
rdmasched/cli.py).

A command module has `HELP` (one line, its help in `rdmasched --help`), `add_arguments(p)`
(its options on its own parser), optionally `check(parser, args)` (what one option alone
cannot say: relations between options, paths; `parser.error` exits 2) and `main(args)` (runs
it, returns the exit code). The argument types they share are in `args`. Library code
(bench/, sim/, demo/, telemetry/, ...) never imports this package: what a command and a
library both need lives in the library.
"""
