"""decode stage."""
