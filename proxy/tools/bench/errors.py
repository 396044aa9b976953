"""The one error ``kfan bench`` stops on: a phase that could not be measured (its message says why)."""


class BenchError(RuntimeError):
    pass
