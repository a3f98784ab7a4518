"""twinwatch: watch machines through their digital twins."""

__version__ = "0.1.0"
