"""Errors the engine raises on bad input; each carries a message meant for the person who caused it."""


class EngineError(Exception):
    """Base of the engine's own errors."""


class InvalidRequestError(EngineError, ValueError):
    """A request that cannot be served as given (empty prompt, too long, bad sampling values)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelLoadError(EngineError):
    """A model path or preset that does not exist, or a checkpoint that cannot be read."""


class EngineFailed(EngineError):
    """The engine stopped serving for good (its loop died or stuck); the process should exit and be restarted."""
