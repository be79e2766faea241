"""runner: converge a machine to a declarative pipeline.yaml, resuming after failures."""

__version__ = "0.1.0"
