"""A seeded, virtual-time simulation of many call nodes through the real services."""
