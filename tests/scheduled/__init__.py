"""Tests of seed 000, "Scheduled reactions": one module per section of the seed."""
