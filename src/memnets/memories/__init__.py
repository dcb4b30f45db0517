"""nn.Modules holding memory parameters (never hidden tensors); state is passed explicitly."""
