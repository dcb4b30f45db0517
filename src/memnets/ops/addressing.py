"""NTM addressing ops (SPEC §7): content, interpolation, shift, sharpen, erase/add."""
__all__: list[str] = []
