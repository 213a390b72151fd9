"""The published maps: short compositions of the combinators."""
