"""The combinators: one small equinox Module per file."""
