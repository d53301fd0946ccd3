"""asyncsim: a discrete-event simulator for staleness and minima selection in async SGD."""

__version__ = "0.1.0"
