"""TAP-style checks for the coordinator's client scripts: `ok - …` and
`not ok - …` lines, counted by tests/coordinator/run.sh."""


class Checks:
    """check(description, condition, detail) prints one line, prefixed by
    the script's name; `failures` counts the lines that were not ok, and
    `detail` is shown on those only."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.failures = 0

    def __call__(self, description, condition, detail=""):
        line = ("ok - " if condition else "not ok - ") + self.prefix + ": " + description
        if not condition:
            self.failures += 1
            if detail:
                line += f" ({detail})"
        print(line, flush=True)
        return condition
