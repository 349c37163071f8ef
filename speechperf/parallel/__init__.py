"""parallel stage."""
