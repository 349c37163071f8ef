"""features stage."""
