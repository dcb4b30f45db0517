"""Task models: encoder/controller + memory + readout, each with a typed config."""
