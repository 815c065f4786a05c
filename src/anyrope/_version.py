"""The package version (read by the build, the self-check and ``anyrope.__version__``)."""

__version__ = "0.1.0"
