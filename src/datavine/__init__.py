"""datavine: a data-aware scheduler for particle-physics analysis on TaskVine."""

__version__ = "0.1.0"
