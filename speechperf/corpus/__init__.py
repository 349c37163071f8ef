"""corpus stage."""
