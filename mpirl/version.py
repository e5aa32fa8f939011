"""The package's version (setup.cfg reads it from here; run.h5's provenance records it)."""

__version__ = "0.1.0"
