"""DNC memory-access ops (SPEC §8): usage, allocation, precedence, temporal links."""
__all__: list[str] = []
